"""DataLoader worker processes that survive the signals a scheduler sends to every process of a job."""

from __future__ import annotations

import copy
import functools
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_scale.preemption.signal_notice import checked_signal_names

__all__ = ["ShieldFromJobSignals", "shield_workers"]


class ShieldFromJobSignals:
    """A ``worker_init_fn`` (wrapping yours) under which DataLoader workers survive a job's preemption signals.

    SLURM signals every process of a job step on preemption or ``scancel``, DataLoader workers included. torch's
    workers die of a SIGTERM that their parent did not send, and the training process then fails at once
    ("DataLoader worker (pid N) is killed by signal: Terminated"), before it can save at its next step. In a shielded
    worker these signals are blocked and a thread waits for them: one sent by the loader's own process (which
    terminates workers that do not stop when asked) ends the worker, as in torch; any other is ignored, and the worker
    goes on until its loader stops it. :class:`~lightning_scale.callbacks.SpotPreemption` shields the workers of
    every dataloader of the fit with the signals it listens to.

    Threads that a worker started before ``worker_init_fn`` are not covered by the function alone (at-fork hooks of
    other libraries start some; importing torch in a ``spawn`` worker starts one): use :func:`shield_workers`, which
    also starts ``fork`` and ``spawn`` workers with the signals already blocked. ``forkserver`` workers are covered
    when the server has torch preloaded (``multiprocessing.set_forkserver_preload(["torch"])``). A worker left with
    exposed threads says so on stderr.

    Args:
        worker_init_fn: The loader's own ``worker_init_fn``, called after the shield is up.
        signals: Signal names to survive, e.g. ``("SIGTERM", "SIGUSR1")``.

    Examples:
        >>> from torchdata.stateful_dataloader import StatefulDataLoader
        >>> loader = StatefulDataLoader(range(8), num_workers=2)
        >>> shield_workers(loader, ("SIGTERM", "SIGUSR1"))
        True
    """

    def __init__(
        self, worker_init_fn: Callable[[int], Any] | None = None, signals: Sequence[str] = ("SIGTERM", "SIGUSR1")
    ) -> None:
        self.worker_init_fn = worker_init_fn
        self.signals = checked_signal_names(signals)
        self.loader_pid = os.getpid()

    def __call__(self, worker_id: int) -> None:
        signums = {signal.Signals[name] for name in self.signals}
        signal.pthread_sigmask(signal.SIG_BLOCK, signums)  # threads started from now on inherit the mask
        waiter = threading.Thread(target=self._wait, args=(signums,), name="job-signal-shield", daemon=True)
        waiter.start()
        exposed = _threads_not_blocking(signums, besides=waiter.native_id)  # unblocked while it waits for them
        if exposed:
            print(
                f"DataLoader worker {os.getpid()}: {exposed} thread(s) started before worker_init_fn can still "
                f"receive {', '.join(self.signals)} and die of it. Shield the loader with "
                "lightning_scale.data.shield_workers (fork or spawn workers), or preload torch in the forkserver.",
                file=sys.stderr,
                flush=True,
            )
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)

    def _wait(self, signums: set[signal.Signals]) -> None:
        while True:
            received = signal.sigwaitinfo(signums)
            if received.si_pid == self.loader_pid:
                os._exit(0)
            name = signal.Signals(received.si_signo).name
            print(
                f"DataLoader worker {os.getpid()} ignores {name} from pid {received.si_pid}: it stops when its loader "
                "stops it.",
                file=sys.stderr,
                flush=True,
            )


def _threads_not_blocking(signums: set[signal.Signals], besides: int | None) -> int:
    """How many threads of this process but ``besides`` would receive one of ``signums`` (0 where ``/proc`` does not
    say)."""
    try:
        tasks = [task for task in os.listdir("/proc/self/task") if int(task) != besides]
        statuses = [Path(f"/proc/self/task/{task}/status").read_text() for task in tasks]
    except OSError:
        return 0
    exposed = 0
    for status in statuses:
        blocked = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
        exposed += any(not blocked >> (signum - 1) & 1 for signum in signums)
    return exposed


class _StartWithSignalsBlocked:
    """``start()`` with ``shield_signums`` blocked in the starting thread, so that the child starts with them blocked
    (a forked child inherits the mask, and an exec-ed one keeps it): every thread it starts inherits it too, even
    those started before ``worker_init_fn`` (by at-fork hooks, or by importing torch)."""

    shield_signums: frozenset[signal.Signals] = frozenset()

    def start(self) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, self.shield_signums)
        try:
            super().start()  # type: ignore[misc]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _ForkProcess(_StartWithSignalsBlocked, multiprocessing.context.ForkProcess):
    pass


class _SpawnProcess(_StartWithSignalsBlocked, multiprocessing.context.SpawnProcess):
    pass


_BLOCKING_PROCESSES = {"fork": _ForkProcess, "spawn": _SpawnProcess}  # a forkserver's children inherit its mask


def shield_workers(loader: Any, signals: Sequence[str]) -> bool:
    """Shield ``loader``'s worker processes from ``signals``: a :class:`ShieldFromJobSignals` around its
    ``worker_init_fn``, and, with ``fork`` or ``spawn``, workers that start with the signals already blocked (so that
    no thread of theirs is exposed). Does nothing to a loader without workers or already shielded; returns whether
    it did something. Call it before the loader's iterator starts its workers."""
    if getattr(loader, "num_workers", 0) == 0 or isinstance(loader.worker_init_fn, ShieldFromJobSignals):
        return False
    shield = ShieldFromJobSignals(loader.worker_init_fn, signals)
    context = loader.multiprocessing_context or multiprocessing.get_context()
    blocking = _BLOCKING_PROCESSES.get(context.get_start_method())
    if blocking is not None:
        signums = frozenset(signal.Signals[name] for name in shield.signals)
        shielded = copy.copy(context)
        shielded.Process = functools.partial(_blocking_process, blocking, signums)  # type: ignore[misc]  # this copy only
        loader.multiprocessing_context = shielded
    loader.worker_init_fn = shield
    return True


def _blocking_process(
    cls: type[_StartWithSignalsBlocked], signums: frozenset[signal.Signals], *args: Any, **kwargs: Any
) -> _StartWithSignalsBlocked:
    process = cls(*args, **kwargs)
    process.shield_signums = signums
    return process
