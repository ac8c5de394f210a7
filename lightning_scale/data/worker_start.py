"""DataLoader workers that start safely in distributed runs, and a report instead of a hang when they do not start.

A rank that forks its DataLoader workers while gloo's or NCCL's threads (and other loaders' queue feeders) run can,
rarely, leave a worker deadlocked inside ``os.fork()``: the job then hangs before its first batch. Workers started
from a forkserver are forked by a process that runs no such threads. :func:`safe_worker_context` gives a loader that
context when the user chose none; :class:`WorkerStartWatchdog` turns a worker that still does not start into a
report with every stack and a non-zero exit, which an orchestrator restarts.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import multiprocessing
import multiprocessing.context
import os
import pickle
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["STUCK_WORKERS_EXIT_CODE", "WorkerStartWatchdog", "safe_worker_context"]

STUCK_WORKERS_EXIT_CODE = 124
"""Exit code of a rank whose DataLoader workers did not deliver a batch in time (``timeout``'s convention)."""

FORKSERVER_PRELOAD = ["torch", "lightning_scale.data.worker_rng_dataset", "lightning_scale.data._forkserver_setup"]
"""Modules the forkserver imports once, so that each worker forked from it starts without importing them."""


def safe_worker_context(loader: Any, name: str) -> multiprocessing.context.BaseContext | None:
    """A forkserver context for ``loader``'s workers, or ``None`` (fork, with a warning) where it cannot be used.

    Forkserver workers receive the dataset, ``collate_fn`` and ``worker_init_fn`` pickled, and import the script
    being run (as ``spawn`` does). What does not pickle keeps fork, and so does a script without an
    ``if __name__ == "__main__":`` guard, which each worker would run again.
    """
    problem = _unpicklable((loader.dataset, loader.collate_fn, loader.worker_init_fn))
    if problem is None and not _main_is_safe_to_import():
        problem = (
            f'the script being run ({_main_name()}) has no `if __name__ == "__main__":` guard: forkserver workers '
            "import it, and would run it again"
        )
    if problem is not None:
        warnings.warn(
            f"{name}: its workers start with fork, which can rarely deadlock a worker at start-up while the process "
            f"group's threads run, because {problem}. Fix that, or choose multiprocessing_context yourself to "
            "silence this.",
            stacklevel=2,
        )
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)  # takes effect when the forkserver starts (once per process)
    return context


class _TrialPickler(pickle.Pickler):
    """Pickles the structure of an object without its array data."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage)) or type(obj).__module__ == "numpy":
            return id(obj)  # shared memory or copied by value in real pickling; never a reason to fail
        return None


def _unpicklable(objects: tuple[Any, ...]) -> str | None:
    try:
        _TrialPickler().dump(objects)
    except Exception as error:  # what pickling raises is open-ended (PicklingError, TypeError, AttributeError)
        return f"the dataset, collate_fn or worker_init_fn cannot be pickled ({type(error).__name__}: {error})"
    return None


def _main_name() -> str:
    main = sys.modules.get("__main__")
    return getattr(getattr(main, "__spec__", None), "name", None) or str(getattr(main, "__file__", "__main__"))


def _main_is_safe_to_import() -> bool:
    """Whether a worker that imports the running script (as multiprocessing's spawn and forkserver do) runs nothing:
    there is no script (``python -c``, a notebook), it is a package's ``__main__`` (never imported), or it keeps its
    work under ``if __name__ == "__main__":``."""
    main = sys.modules.get("__main__")
    module_name = getattr(getattr(main, "__spec__", None), "name", None)
    if module_name is not None and (module_name == "__main__" or module_name.endswith(".__main__")):
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return module_name is None
    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:""", source, re.MULTILINE) is not None


class WorkerStartWatchdog:
    """Report and exit when a training loader's workers deliver no batch within ``timeout_s`` of starting.

    :meth:`arm` when an iterator (and its workers) starts, :meth:`disarm` at the first batch. On expiry the thread
    prints what was waited for, every thread's stack of this process and of its worker processes (those that
    inherited the ``SIGUSR2`` handler this class installs when the signal is unused), stops the workers and calls
    ``exit_fn(STUCK_WORKERS_EXIT_CODE)``.

    Args:
        timeout_s: Seconds from :meth:`arm` to the first batch.
        exit_fn: Called on expiry with the exit code (``os._exit`` by default).

    Example:
        >>> watchdog = WorkerStartWatchdog(timeout_s=600)
        >>> watchdog.arm("training dataloader #0, epoch 0")
        >>> watchdog.disarm()
        >>> watchdog.close()
    """

    def __init__(self, timeout_s: float, exit_fn: Callable[[int], Any] = os._exit) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0 (seconds for DataLoader workers to deliver a batch).")
        self.timeout_s = timeout_s
        self.exit_fn = exit_fn
        self._condition = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, what: str) -> None:
        """Start waiting for the first batch of ``what`` (no-op while already waiting)."""
        with self._condition:
            if self._deadline is not None:
                return
            self._deadline, self._what = time.monotonic() + self.timeout_s, what
            if self._thread is None:
                _dump_stacks_on_sigusr2()
                self._thread = threading.Thread(target=self._watch, name="worker-start-watchdog", daemon=True)
                self._thread.start()
            self._condition.notify()

    def disarm(self) -> None:
        """A batch arrived."""
        with self._condition:
            self._deadline = None

    def close(self) -> None:
        """Stop the thread; safe to call twice."""
        with self._condition:
            self._closed, self._deadline = True, None
            self._condition.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self._closed = False

    def _watch(self) -> None:
        with self._condition:
            while not self._closed:
                if self._deadline is None:
                    self._condition.wait()
                elif (left := self._deadline - time.monotonic()) > 0:
                    self._condition.wait(left)
                else:
                    break
            if self._closed:
                return
        self._report_and_exit()

    def _report_and_exit(self) -> None:
        workers = multiprocessing.active_children()
        print(
            f"lightning-scale: {self._what}: no batch {self.timeout_s:.0f} s after its DataLoader workers started "
            f"(worker pids {[w.pid for w in workers]}); a worker is stuck. Stacks follow; exiting with "
            f"{STUCK_WORKERS_EXIT_CODE} so that the job is restarted (LIGHTNING_SCALE_WORKER_START_TIMEOUT_S sets "
            "the bound).",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for worker in workers:
            if worker.pid is not None:
                _signal(worker.pid, signal.SIGUSR2)
                time.sleep(0.5)  # one process at a time in the log
        for worker in workers:
            if worker.pid is not None:
                _signal(worker.pid, signal.SIGKILL)
        sys.stderr.flush()
        self.exit_fn(STUCK_WORKERS_EXIT_CODE)


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _dump_stacks_on_sigusr2() -> None:
    """Let SIGUSR2 dump every thread's stack in this process and the workers it forks, when nothing else uses it."""
    if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
        faulthandler.register(signal.SIGUSR2, all_threads=True)
