"""Warm restarts: each rank's process stays alive across failures and starts every training attempt from itself.

Under torchrun, the process torchrun starts for a rank (the *parent*) imports everything once, then forks the
training process of each attempt (the *child*, in a process group of its own, killed if the parent dies). The
parents of a job share a small store (:class:`~lightning_scale.restart.board.AttemptBoard`):

- a child that exits with a failure (an exception, a signal such as SIGKILL, a hang exit), that is stopped (SIGSTOP:
  it cannot run again by itself), or that its peers wait for while it makes no progress (rank 0's parent judges,
  :mod:`~lightning_scale.restart.hangs`; its stacks are printed first), makes its parent say so; every parent then
  kills its own child at once (no rank waits for a collective's timeout), they meet, and each forks the next attempt,
  which resumes from the memory snapshots. Interpreter start, imports and torchrun's restart are not paid again, nor
  the start of a forkserver for DataLoader workers: the parent forks one, with what it imported, before the first
  attempt, and every attempt uses it (:func:`~lightning_scale.data.forkserver.start_forkserver`);
- each attempt's process group gets a store of its own (on a free port chosen by rank 0's parent), so no key of a
  failed attempt is read by the next;
- what is not a failure ends the parent with the child's code, for torchrun and the orchestrator to act on: success
  (0), a usage error (2), a preemption (143); so does a failure once the warm restarts are spent, or a peer whose
  parent is gone (its node was lost): torchrun's own restart, SLURM's requeue or Kubernetes take over from there. A
  parent that ends closes its link to rank 0's parent (:mod:`~lightning_scale.restart.links`), which the others see at
  once; one whose host vanished without closing it is found by its heartbeat standing still.

Signals the parent receives (torchrun's SIGTERM, SLURM's USR1) are passed on to the child, whose callbacks act on
them, and end the parent once the child exited.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from lightning_scale import distributed, knobs
from lightning_scale._linux import die_with_parent
from lightning_scale._python_internals import adopt_forkserver, run_exit_functions
from lightning_scale.data.forkserver import kill_forkserver_workers, start_forkserver
from lightning_scale.errors import USAGE_ERROR_EXIT_CODE
from lightning_scale.restart import beacon
from lightning_scale.restart.board import AttemptBoard
from lightning_scale.restart.hangs import PeerHangJudge
from lightning_scale.restart.links import ParentLinks

__all__ = [
    "FINAL_EXIT_CODES",
    "LAUNCHER_PID_VARIABLE",
    "PREEMPTED_EXIT_CODE",
    "Supervisor",
    "supervise",
    "warm_restarts_apply",
]

LAUNCHER_PID_VARIABLE = "LIGHTNING_SCALE_LAUNCHER_PID"
"""Set in each child: the process id of whatever started its parent (torchrun's agent), which a child's own parent
process id no longer is."""

PREEMPTED_EXIT_CODE = 143
"""A training process that saved on a preemption notice exits with this (128 + SIGTERM)."""

FINAL_EXIT_CODES = frozenset({0, USAGE_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE})
"""Exit codes of a training process that end its parent too: done, a usage error, a preemption."""

_Outcome = tuple[int, str | None]  # a child's exit code, and this rank's reason to report (None: a peer's failure)

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def warm_restarts_apply(max_restarts: int) -> bool:
    """Whether a process started by torchrun on Linux should run its training as warm-restarted children: not when
    torchrun shares its agent's store with the workers of several nodes, whose restart counts differ (such jobs set
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` anyway, see ``distributed.init_process_group_per_attempt``)."""
    if max_restarts <= 0 or "TORCHELASTIC_RUN_ID" not in os.environ or sys.platform != "linux":
        return False
    return not (_agent_store() and int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1)


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def supervise(attempt: Callable[[], None], max_restarts: int) -> int:
    """Run ``attempt`` (the training) in a child process, again after each failure, at most ``max_restarts`` more
    times; the exit code for torchrun. Call from the process torchrun started, before any thread starts."""
    return Supervisor(attempt, max_restarts).run()


class Supervisor:
    """One rank's parent process (see the module's description).

    Args:
        attempt: The training, run in each child.
        max_restarts: Warm restarts at most before a failure is left to torchrun.
        poll_s: How often the parent looks at its child and at the board.
        peer_timeout_s: A peer's heartbeat that stands still this long means its parent is gone.
        ready_timeout_s: The longest wait for every parent to be ready for the next attempt.
    """

    def __init__(
        self,
        attempt: Callable[[], None],
        max_restarts: int,
        poll_s: float = knobs.WARM_POLL_S,
        peer_timeout_s: float = knobs.WARM_PEER_TIMEOUT_S,
        ready_timeout_s: float = knobs.WARM_READY_TIMEOUT_S,
    ) -> None:
        # first, as a fork of this process holding no socket of the parents' yet; every attempt's workers use it
        self.forkserver = start_forkserver()
        self.attempt = attempt
        self.max_restarts = max_restarts
        self.poll_s, self.peer_timeout_s, self.ready_timeout_s = poll_s, peer_timeout_s, ready_timeout_s
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.host = os.environ["MASTER_ADDR"]
        self.child: int | None = None  # the child's pid until it is reaped
        self.group: int | None = None  # its process group, until killed (its DataLoader workers may outlive it)
        self.received: int | None = None  # a signal that ends this parent once its child exited
        self._board: AttemptBoard | None = None
        self._links = ParentLinks(self.rank, self.world_size, self.host)
        self._said_gone: set[int] = set()  # ranks rank 0's parent told the others are gone
        self._ended: set[int] = set()  # ranks whose parent ended with a final code
        self._beacon = beacon.install()  # before any child is forked: each child marks its progress there

    @property
    def board(self) -> AttemptBoard:
        """The parents' store: torchrun's agent store when it shares it with the workers (one node: its keys under
        torchrun's restart count, as it outlives torchrun's restarts), else a new one for this rendezvous on rank 0's
        parent at ``MASTER_PORT`` (where rank 0's own store would have been)."""
        if self._board is None:
            shared = _agent_store()
            store = distributed.coordination_store(
                self.host,
                int(os.environ["MASTER_PORT"]),
                serve=not shared and self.rank == 0,
                timeout_s=self.ready_timeout_s,
                prefix=f"lightning_scale/warm/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/" if shared else "",
            )
            self._board = AttemptBoard(store, self.rank, self.world_size)
        return self._board

    def run(self) -> int:
        for sig in _FORWARDED:
            signal.signal(sig, self._forward)
        if self.rank > 0:
            self._links.connect(self.board.links_port())
        elif self.world_size > 1:
            self.board.publish_links_port(self._links.port)
        try:
            return self._attempts()
        finally:
            self._links.close()

    def _attempts(self) -> int:
        code = 1
        for attempt in range(self.max_restarts + 1):
            if self.rank == 0:
                self.board.publish_port(attempt, _free_port(self.host))
            self._beacon.reset()
            self.board.publish_progress(attempt, self._beacon.read())
            self.child = self.group = self._fork(attempt, self.board.port(attempt))
            code, reason = self._watch(attempt)
            if code in FINAL_EXIT_CODES or self.received is not None:
                self._end()
                return code
            if self._host_lost():
                self._kill_child()
                self._say("no warm restart: the parent of rank 0, which holds the parents' board, is gone. Exiting "
                          "for torchrun to restart the job.")  # fmt: skip
                return code
            if reason is not None:
                self.board.fail(attempt, reason)
            if self.board.accused(attempt):
                self._dump_child_stacks()
            self._kill_child()
            if attempt == self.max_restarts:
                self._say(f"no warm restart left ({self.max_restarts} used): exiting {code} for torchrun to restart")
                return code
            if not self._meet(attempt + 1):
                return code
            if self.rank == 0:
                reasons = "; ".join(self.board.reasons(attempt)) or "a training process failed"
                self._say(f"{reasons}. Restarting every rank's training from its parent (attempt {attempt + 1}).")
        return code

    def _watch(self, attempt: int) -> _Outcome:
        """Until the child exits or stops, or a peer's fails: the child's exit code (a signal's as 128 + signal) and
        this rank's reason to report, ``None`` when the failure was a peer's."""
        assert self.child is not None
        clocks = {"beat": 0.0, "look": 0.0}
        judge = PeerHangJudge(self.world_size) if self.rank == 0 else None
        while True:
            pid, status = os.waitpid(self.child, os.WNOHANG | os.WUNTRACED)
            if pid and os.WIFSTOPPED(status):
                name = signal.Signals(os.WSTOPSIG(status)).name
                return 128 + os.WSTOPSIG(status), f"rank {self.rank}'s training process was stopped by {name}"
            if pid:
                self.child = None
                return _exit_code(status), f"rank {self.rank}'s training process {_how_it_ended(status)}"
            try:
                lost = self._lost_links()
                outcome = self._look(attempt, judge, clocks) if not lost else None
            except RuntimeError:  # a board request failed: expected only when its host is gone
                if not self._host_lost(wait_s=1.0):
                    raise
                lost, outcome = [0], None
            if lost:
                return 1, f"the parent of rank(s) {lost} is gone (its node was lost?)"
            if outcome is not None:
                return outcome
            time.sleep(self.poll_s)

    def _look(self, attempt: int, judge: PeerHangJudge | None, clocks: dict[str, float]) -> _Outcome | None:
        """One look at the board while the child runs (this parent's heartbeat and progress published, hung ranks
        accused): ``None`` to go on, else what :meth:`_watch` returns."""
        now = time.monotonic()
        if now - clocks["beat"] >= min(0.25, self.peer_timeout_s / 4):
            self.board.beat()
            self.board.publish_progress(attempt, self._beacon.read())
            clocks["beat"] = now
        if self.board.failed(attempt):
            return 1, None
        if now - clocks["look"] < 1.0:
            return None
        clocks["look"] = now
        silent = self.board.silent_peers(self.peer_timeout_s)
        if silent:
            return 1, f"the parent of rank(s) {silent} is gone (its node was lost?)"
        for rank, still_s in judge.observe(self.board.progress(attempt)) if judge is not None else []:
            reason = f"rank {rank} made no progress for {still_s:.1f} s while the others waited for it"
            self.board.accuse(attempt, rank, reason)
        return None

    def _meet(self, attempt: int) -> bool:
        """Wait until every parent is ready for ``attempt``; False when one is gone or the wait times out."""
        self.board.arrive(attempt)
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.board.everyone_arrived(attempt):
            self.board.beat()
            silent = self._lost_links() or self.board.gone() or self.board.silent_peers(self.peer_timeout_s)
            if silent or time.monotonic() > deadline or self.received is not None:
                why = f"the parent of rank(s) {silent} is gone" if silent else "not every parent got ready in time"
                self._say(f"no warm restart: {why}. Exiting for torchrun to restart the job.")
                return False
            time.sleep(self.poll_s)
        return True

    def _lost_links(self) -> list[int]:
        """Ranks whose parent ended without saying it ended with a final code, as this one's links show; rank 0's
        parent tells the others on the board."""
        lost = self._links.lost()
        if self.rank > 0:
            return lost
        for rank in set(lost) - self._said_gone - self._ended:
            if self.board.said_final(rank):
                self._ended.add(rank)
        lost = [rank for rank in lost if rank not in self._ended]
        for rank in set(lost) - self._said_gone:
            self._said_gone.add(rank)
            self.board.say_gone(rank)
        return lost

    def _host_lost(self, wait_s: float = 0.0) -> bool:
        """Whether rank 0's parent, which hosts the board, is gone (ranks other than 0), waiting up to ``wait_s`` for
        its link to show it."""
        deadline = time.monotonic() + wait_s
        while self.rank > 0 and 0 not in self._links.lost():
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return self.rank > 0

    def _end(self) -> None:
        """Before this parent ends with its training's final code: it says so, so that no peer takes its closed link
        or still heartbeat for a lost node; rank 0's parent, which hosts the board, waits until the others have
        ended (at most ``ready_timeout_s``)."""
        if self.rank > 0:
            with contextlib.suppress(RuntimeError):  # the board's host ended first (it waited its longest)
                self.board.say_final()
            return
        deadline = time.monotonic() + self.ready_timeout_s
        while len(self._links.lost()) < self.world_size - 1 and time.monotonic() < deadline:
            time.sleep(self.poll_s)

    def _fork(self, attempt: int, port: int) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        parent, launcher = os.getpid(), os.getppid()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.setpgid(0, 0)
            die_with_parent(parent)
            self._links.close()  # this parent's ends: the child's copies would keep them open after the parent died
            adopt_forkserver()
            for sig in _FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            os.environ["MASTER_PORT"] = str(port)  # a store of this attempt's own, hosted by rank 0's child
            os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
            os.environ.setdefault(LAUNCHER_PID_VARIABLE, str(launcher))
            code = _run(self.attempt)
        finally:
            os._exit(code)

    def _dump_child_stacks(self) -> None:
        """Have the hung child print every stack (``HangWatchdog``'s SIGUSR2 handler) before it is killed."""
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGUSR2)
            time.sleep(1.0)

    def _kill_child(self) -> None:
        """Kill the child and everything in its process group (its fork DataLoader workers), reap it, and kill the
        workers it had from the forkserver."""
        if self.group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.group, signal.SIGKILL)
        if self.child is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.child, 0)
        kill_forkserver_workers(self.forkserver)
        self.child = self.group = None

    def _forward(self, sig: int, frame: Any) -> None:
        if sig != signal.SIGUSR2:  # a stack dump request, not an end
            self.received = sig
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, sig)

    def _say(self, message: str) -> None:
        print(f"lightning-scale: {message}", file=sys.stderr, flush=True)


def _run(attempt: Callable[[], None]) -> int:
    """Run ``attempt`` in the child; its exit code. The interpreter is not torn down (the parent's objects, such as its
    store, belong to the parent), but the exit functions run (W&B finishes its run there)."""
    code: int = 0
    try:
        attempt()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        if isinstance(exit.code, str):
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        run_exit_functions()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1" if host == "localhost" else host, 0))
        return int(probe.getsockname()[1])
