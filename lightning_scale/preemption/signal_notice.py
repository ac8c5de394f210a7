"""Preemption notices delivered as POSIX signals (SLURM, torchrun, Kubernetes, docker stop)."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from lightning_scale.errors import ConfigurationError
from lightning_scale.preemption.notice import Notice
from lightning_scale.preemption.polling import validate_interval

__all__ = ["SignalNotice"]


class SignalNotice:
    """A notice when the process receives one of ``signals``.

    The handler only records the signal and the time: no I/O, no logging, no collective runs inside it. It is
    installed by :meth:`start` (``SpotPreemption`` calls it in ``on_train_start``, after Lightning registered its own
    handlers, which it replaces for these signals) and the previous handlers come back on :meth:`stop`.

    Args:
        signals: Signal names, e.g. ``("SIGTERM", "SIGUSR1")``.
        grace_seconds: Time between the signal and the hard kill (torchrun sends SIGKILL 30 s after SIGTERM;
            SLURM's ``--signal=USR1@90`` gives 90 s).

    Examples:
        >>> source = SignalNotice(signals=("SIGUSR1",), grace_seconds=20)
        >>> source.poll() is None
        True
    """

    def __init__(self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1"), grace_seconds: float = 25.0) -> None:
        self.signals = checked_signal_names(signals)
        self.grace_seconds = validate_interval(grace_seconds, "grace_seconds")
        self._received: tuple[str, float] | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def start(self) -> None:
        for name in self.signals:
            signum = signal.Signals[name]
            if signum not in self._previous:
                self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._received is None:
            self._received = (signal.Signals(signum).name, time.time())

    def poll(self) -> Notice | None:
        if self._received is None:
            return None
        name, at = self._received
        return Notice(source=name, received_unix=at, deadline_unix=at + self.grace_seconds, detail=f"signal {name}")

    def acknowledge(self, notice: Notice) -> None:
        """Signals need no answer."""

    def stop(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()


def checked_signal_names(signals: Sequence[str]) -> tuple[str, ...]:
    """``signals`` as a tuple, or a ``ValueError`` naming the ones that cannot be caught (or none at all)."""
    valid = sorted(s.name for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP))
    unknown = [name for name in signals if name not in valid]
    if unknown or not signals:
        raise ConfigurationError(f"signals={list(signals)!r}: unknown or empty; choose from {', '.join(valid)}.")
    return tuple(signals)
