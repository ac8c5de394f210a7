"""The stopped processes of a hung rank's own torchrun worker group, killed once the rank has exited.

A peer frozen by SIGSTOP (or anything that stops a process) leaves the other ranks blocked in a collective; their
:class:`~lightning_scale.callbacks.HangWatchdog` reports the hang and exits. torchrun then stops the rest of the worker
group with SIGTERM and waits 30 s for each process before it sends SIGKILL, a wait no flag shortens
(``LocalElasticAgent`` closes its workers with that default): a stopped process never takes the SIGTERM, so each such
restart would be 30 s late. The rank that reports the hang leaves behind a small process of its own session that
SIGKILLs the group's stopped local ranks :data:`GRACE_S` after the rank has exited, as torchrun's SIGKILL 30 s later
would have: torchrun (which looks every 0.1 s) sees the rank's own exit code first and names it as the failure, not
the kill. Only processes of the same torchrun agent (the same parent) and the same job and node
(``TORCHELASTIC_RUN_ID`` and ``GROUP_RANK`` in the environment they started with), still stopped then, are killed;
nothing outside torchrun. Ranks on other nodes are their own agents' to stop.
"""

from __future__ import annotations

import os
import subprocess
import sys

from lightning_scale._linux import parent_ids, process_environment, process_state

__all__ = ["GRACE_S", "kill_stopped_peers_after_exit", "stopped_peers"]

GRACE_S = 1.0
"""How long after the rank's exit its stopped peers are killed: ten of torchrun's default monitor intervals."""

_GROUP = ("TORCHELASTIC_RUN_ID", "GROUP_RANK")

# python -S -c _KILLER RANK_PID GRACE_S PEER...: waits for the rank to end (gone, or a zombie its agent has not reaped),
# then GRACE_S, then SIGKILLs each peer still stopped; the standard library only, no site-packages (its state() is
# lightning_scale._linux.process_state's: importing the package would cost seconds of torch's and Lightning's import)
_KILLER = """
import os, signal, sys, time
rank, grace, peers = int(sys.argv[1]), float(sys.argv[2]), [int(pid) for pid in sys.argv[3:]]
def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
deadline = time.monotonic() + 600
while state(rank) not in (None, "Z") and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(grace)
for pid in peers:
    if state(pid) == "T":
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
"""


def stopped_peers() -> list[int]:
    """The stopped (state ``T``) processes of this process's torchrun worker group on this node, this one excluded;
    empty outside torchrun."""
    if any(name not in os.environ for name in _GROUP):
        return []
    group = {name: os.environ[name] for name in _GROUP}
    me, parent = os.getpid(), os.getppid()
    siblings = [pid for pid, ppid in parent_ids().items() if ppid == parent and pid != me]
    return sorted(
        pid
        for pid in siblings
        if process_state(pid) == "T" and {name: process_environment(pid).get(name) for name in _GROUP} == group
    )


def kill_stopped_peers_after_exit(grace_s: float = GRACE_S) -> list[int]:
    """Have :func:`stopped_peers` SIGKILLed ``grace_s`` after this process ends, by a process of its own session
    (torchrun's stop of this rank's process group does not reach it); the process ids it will kill if still stopped.
    Call it right before exiting."""
    peers = stopped_peers()
    if peers:
        subprocess.Popen(
            [sys.executable, "-S", "-c", _KILLER, str(os.getpid()), str(grace_s), *map(str, peers)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    return peers
