"""A hang becomes a restart: :class:`ProgressWatchdog` ends a process that makes no progress for its phase's
allowance, and :class:`StepAllowance` sizes that allowance from the step times it measured.

A rank that hangs (a frozen peer leaves it blocked in a collective, a deadlocked DataLoader worker, a stall in user
code) never exits by itself, so no orchestrator restarts anything. The watchdog's thread needs no collective: each
rank watches its own progress and, past the deadline, prints what it was doing, every stack of the process and of
its DataLoader workers, and exits with :data:`HANG_EXIT_CODE`, which torchrun (``--max-restarts``) and Kubernetes
restart like any failure (a SLURM job is requeued or resubmitted); the restarted job resumes from its newest valid
checkpoint.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from lightning_scale.errors import ConfigurationError
from lightning_scale.health.stacks import dump_stacks_on_sigusr2, report_stacks_and_stop_workers

__all__ = ["HANG_EXIT_CODE", "ProgressWatchdog", "StepAllowance"]

HANG_EXIT_CODE = 75
"""Exit code of a rank that made no progress within its allowance (``EX_TEMPFAIL``: a temporary failure, retry)."""


class StepAllowance:
    """How long a rank may go without progress: ``startup_s`` until the first steps were measured (set-up, the first
    batch with its compilation, an epoch's start), then ``factor`` times the slowest of the last ``window`` measured
    intervals between two progress marks, never less than ``min_s``.

    A 50 ms step gets ``min_s`` (5 minutes by default), a 10-minute step 200 minutes.

    Examples:
        >>> allowance = StepAllowance(min_s=60.0, factor=20.0, startup_s=900.0)
        >>> allowance.seconds()  # nothing measured yet
        900.0
        >>> allowance.measured(0.05); allowance.seconds()
        60.0
        >>> allowance.measured(10.0); allowance.seconds()
        200.0
    """

    def __init__(self, min_s: float, factor: float, startup_s: float, window: int = 100) -> None:
        for name, value in (("min_s", min_s), ("factor", factor), ("startup_s", startup_s)):
            if value <= 0:
                raise ConfigurationError(f"{name}={value} must be > 0.")
        self.min_s, self.factor, self.startup_s = min_s, factor, startup_s
        self._intervals: deque[float] = deque(maxlen=window)

    def measured(self, seconds: float) -> None:
        """One interval between two progress marks."""
        self._intervals.append(seconds)

    def slowest_s(self) -> float | None:
        """The slowest of the recent measured intervals (``None``: none measured yet)."""
        return max(self._intervals) if self._intervals else None

    def seconds(self) -> float:
        if not self._intervals:
            return self.startup_s
        return max(self.min_s, self.factor * max(self._intervals))


class ProgressWatchdog:
    """A daemon thread that ends the process when the current phase has made no progress by its deadline.

    :meth:`arm` names the phase and its allowance (``None``: not watched, e.g. while a checkpoint is written, whose
    storage calls have deadlines of their own); arming again is progress. The thread checks at least once a second, so
    a hang is reported between its allowance and a second after it. On expiry: the diagnosis (the phase, how
    long it waited), ``advice``, every stack of this process and of its DataLoader workers (forked after the first
    :meth:`arm`), the workers killed, then ``exit_fn(exit_code)``.

    Args:
        exit_code: Passed to ``exit_fn`` on expiry.
        advice: Printed after the diagnosis: what it means, the exit code, how to tune the allowance.
        exit_fn: Ends the process (``os._exit`` by default: a hung process may never unwind).
        clock: Monotonic seconds.
        describe: ``describe(phase, waited_s)``, the diagnosis (default: the rank made no progress for so long in
            ``phase``).

    Examples:
        >>> watchdog = ProgressWatchdog(HANG_EXIT_CODE, advice="")
        >>> watchdog.arm("training step 1", 300.0)
        >>> watchdog.arm("saving a checkpoint", None)
        >>> watchdog.close()
    """

    def __init__(
        self,
        exit_code: int,
        advice: str,
        exit_fn: Callable[[int], Any] = os._exit,
        clock: Callable[[], float] = time.monotonic,
        describe: Callable[[str, float], str] | None = None,
    ) -> None:
        self.exit_code, self.advice, self.exit_fn, self.clock = exit_code, advice, exit_fn, clock
        self.describe = describe or _no_progress
        self._condition = threading.Condition()
        self._phase = ""
        self._allowance: float | None = None
        self._since = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def running(self) -> bool:
        """Whether the thread is started (until :meth:`close`)."""
        return self._thread is not None

    def arm(self, phase: str, allowance_s: float | None) -> None:
        """From now on, ``phase`` must make progress within ``allowance_s`` (``None``: unwatched).

        Called twice per training step, it only records the phase: the thread is not woken (it checks at least once
        a second), which would cost a context switch per call on a busy machine."""
        with self._condition:
            self._phase, self._allowance, self._since = phase, allowance_s, self.clock()
            if self._thread is None:
                dump_stacks_on_sigusr2()
                self._thread = threading.Thread(target=self._watch, name="lightning-scale-hang-watchdog", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the thread; safe to call twice."""
        with self._condition:
            self._closed = True
            self._condition.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self._closed = False

    def _watch(self) -> None:
        with self._condition:
            while not self._closed:
                if self._allowance is None:
                    self._condition.wait(1.0)
                elif (left := self._since + self._allowance - self.clock()) > 0:
                    self._condition.wait(min(left, 1.0))  # re-armed meanwhile, or a clock that is not monotonic
                else:
                    break
            if self._closed:
                return
            phase, waited = self._phase, self.clock() - self._since
        report_stacks_and_stop_workers(self.describe(phase, waited), self.advice)
        self.exit_fn(self.exit_code)


def _no_progress(phase: str, waited_s: float) -> str:
    return f"lightning-scale: rank {os.environ.get('RANK', '0')} made no progress for {waited_s:.0f} s in {phase}"
