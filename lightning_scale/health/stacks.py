"""Every stack of a stuck process and of its DataLoader workers, in its log, before it exits."""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import signal
import sys
import time

__all__ = ["dump_stacks_on_sigusr2", "report_stacks_and_stop_workers"]


def dump_stacks_on_sigusr2() -> None:
    """Let SIGUSR2 dump every thread's stack in this process and the workers it forks later, when nothing else uses
    the signal."""
    if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
        faulthandler.unregister(signal.SIGUSR2)  # an earlier registration keeps the stderr of its time
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)


def report_stacks_and_stop_workers(what: str, advice: str) -> None:
    """Print ``what`` happened with the child processes' pids and ``advice``, every thread's stack of this process,
    then of each child (DataLoader workers that inherited :func:`dump_stacks_on_sigusr2`'s handler), one at a time,
    and kill the children."""
    workers = multiprocessing.active_children()
    pids = [w.pid for w in workers]
    print(f"{what} (worker pids {pids}); {advice.rstrip('.')}. Stacks follow.", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    for worker in workers:
        if worker.pid is not None:
            _signal(worker.pid, signal.SIGUSR2)
            time.sleep(0.5)  # one process at a time in the log
    for worker in workers:
        if worker.pid is not None:
            _signal(worker.pid, signal.SIGKILL)
    sys.stderr.flush()


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
