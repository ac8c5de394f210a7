"""The stopped processes of a hung rank's own torchrun worker group, killed before the rank exits.

A peer frozen by SIGSTOP (or anything that stops a process) leaves the other ranks blocked in a collective; their
:class:`~lightning_scale.callbacks.HangWatchdog` reports the hang and exits. torchrun then stops the rest of the worker
group with SIGTERM and waits 30 s for each process before it sends SIGKILL, a wait no flag shortens
(``LocalElasticAgent`` closes its workers with that default): a stopped process never takes the SIGTERM, so each such
restart would be 30 s late. A local rank of the same group that is stopped is killed by the rank that reports the
hang, which the SIGKILL 30 s later would have done. Only processes of the same torchrun agent (the same parent) and the
same job and node (``TORCHELASTIC_RUN_ID`` and ``GROUP_RANK`` in the environment they started with) are candidates;
nothing is killed outside torchrun. Ranks on other nodes are their own agents' to stop.
"""

from __future__ import annotations

import contextlib
import os
import signal

from lightning_scale._linux import parent_ids, process_environment, process_state

__all__ = ["kill_stopped_peers", "stopped_peers"]

_GROUP = ("TORCHELASTIC_RUN_ID", "GROUP_RANK")


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


def kill_stopped_peers() -> list[int]:
    """SIGKILL :func:`stopped_peers`; the process ids killed."""
    killed = []
    for pid in stopped_peers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed
