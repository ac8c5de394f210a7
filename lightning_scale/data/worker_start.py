"""A report instead of a hang when DataLoader workers do not start: :class:`WorkerStartWatchdog`.

Workers that never deliver (deadlocked at start-up, stuck in ``worker_init_fn``) leave the training process waiting
forever, and with it every other rank in its next collective: nothing exits, so no orchestrator restarts anything.
The watchdog turns that into a report with every stack and an exit code that an orchestrator restarts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lightning_scale.errors import ConfigurationError
from lightning_scale.health.stacks import dump_stacks_on_sigusr2
from lightning_scale.health.watchdog import ProgressWatchdog

__all__ = ["STUCK_WORKERS_EXIT_CODE", "WorkerStartWatchdog"]

STUCK_WORKERS_EXIT_CODE = 124
"""Exit code of a rank whose DataLoader workers did not deliver a batch in time (``timeout``'s convention)."""


class WorkerStartWatchdog:
    """Report and exit when a loader's workers (a training epoch's, a validation run's) deliver no batch within
    ``timeout_s`` of starting.

    :meth:`arm` when an iterator (and its workers) starts, :meth:`disarm` at the first batch. On expiry the thread
    prints what was waited for, every thread's stack of this process and of its worker processes (those that
    inherited the ``SIGUSR2`` handler this class installs when the signal is unused: at the first :meth:`arm`, or
    earlier with :meth:`let_workers_report_stacks`), stops the workers and calls ``exit_fn(STUCK_WORKERS_EXIT_CODE)``.

    Args:
        timeout_s: Seconds from :meth:`arm` to the first batch.
        exit_fn: Called on expiry with the exit code (``os._exit`` by default).

    Examples:
        >>> watchdog = WorkerStartWatchdog(timeout_s=600)
        >>> watchdog.arm("training dataloader #0, epoch 0")
        >>> watchdog.disarm()
        >>> watchdog.close()
    """

    def __init__(self, timeout_s: float, exit_fn: Callable[[int], Any] = os._exit) -> None:
        if timeout_s <= 0:
            raise ConfigurationError(
                f"timeout_s={timeout_s} must be > 0 (seconds for DataLoader workers to deliver a batch)."
            )
        self.timeout_s = timeout_s
        self._watchdog = ProgressWatchdog(
            STUCK_WORKERS_EXIT_CODE,
            advice=f"a worker is stuck. Exiting with {STUCK_WORKERS_EXIT_CODE} so that the job is restarted "
            "(LIGHTNING_SCALE_WORKER_START_TIMEOUT_S sets the bound)",
            exit_fn=exit_fn,
            describe=lambda what, _: (
                f"lightning-scale: {what}: no batch {timeout_s:.0f} s after its DataLoader workers started"
            ),
        )

    def arm(self, what: str) -> None:
        """Start waiting for the first batch of ``what`` (a wait already running starts again)."""
        self._watchdog.arm(what, self.timeout_s)

    def disarm(self) -> None:
        """A batch arrived."""
        self._watchdog.arm(self._watchdog.phase, None)

    def close(self) -> None:
        """Stop the thread; safe to call twice."""
        self._watchdog.close()

    @staticmethod
    def let_workers_report_stacks() -> None:
        """Install the ``SIGUSR2`` handler now (when the signal is unused): workers forked from here on report their
        stacks should they not deliver. For loaders whose workers start before :meth:`arm` can be called (a
        validation run's: Lightning creates its iterator before any hook); :meth:`arm` installs it too."""
        dump_stacks_on_sigusr2()

    @property
    def running(self) -> bool:
        """Whether its thread is started (until :meth:`close`)."""
        return self._watchdog.running
