"""How often to checkpoint: the Young/Daly first-order optimum from the measured save cost and the expected time
between interruptions, and the wall-time trigger that uses it. Plain arithmetic, no Lightning.

Saving every ``T`` seconds costs ``C/T`` of the time in saves, and an interruption loses ``T/2`` on average, so with
a mean time between interruptions ``M`` the waste ``C/T + T/(2M)`` is least at ``T = sqrt(2 C M)`` (Young 1974,
Daly 2006; first order, valid while ``C`` is small against ``M``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from lightning_scale.errors import ConfigurationError

__all__ = ["AutoCadence", "SaveTimer", "young_daly_interval_seconds"]


def young_daly_interval_seconds(save_seconds: float, mtbi_seconds: float) -> float:
    """``sqrt(2 * save_seconds * mtbi_seconds)``: the interval between saves that wastes the least time."""
    if save_seconds < 0 or mtbi_seconds <= 0:
        raise ValueError(f"save_seconds={save_seconds} must be >= 0 and mtbi_seconds={mtbi_seconds} > 0.")
    return math.sqrt(2.0 * save_seconds * mtbi_seconds)


class AutoCadence:
    """The Young/Daly interval, re-evaluated as saves are measured.

    Args:
        mtbi_seconds: Expected time between interruptions (e.g. from a spot market's history).
        initial_save_seconds: Assumed save cost until the first save is measured.
        window: Saves whose median cost is used (a slow outlier does not swing the interval).

    Examples:
        >>> cadence = AutoCadence(mtbi_seconds=7200, initial_save_seconds=10)
        >>> round(cadence.interval_seconds())
        379
        >>> cadence.record(2.5)
        >>> round(cadence.interval_seconds())
        190
    """

    def __init__(self, mtbi_seconds: float, initial_save_seconds: float = 10.0, window: int = 5) -> None:
        if not mtbi_seconds > 0:
            raise ConfigurationError(f"the mean time between interruptions must be > 0 (got {mtbi_seconds} s).")
        if window < 1:
            raise ConfigurationError(f"window={window} must be >= 1.")
        self.mtbi_seconds = mtbi_seconds
        self.initial_save_seconds = initial_save_seconds
        self._costs: deque[float] = deque(maxlen=window)

    def record(self, save_seconds: float) -> None:
        """A measured save cost (the time training was blocked by one save)."""
        self._costs.append(save_seconds)

    @property
    def save_seconds(self) -> float:
        return statistics.median(self._costs) if self._costs else self.initial_save_seconds

    def interval_seconds(self) -> float:
        return young_daly_interval_seconds(self.save_seconds, self.mtbi_seconds)


class SaveTimer:
    """When a save is due by wall time: ``every_n_minutes`` after the last one, or with ``"auto"`` at the
    :class:`AutoCadence` interval for ``mtbi_hours``, fed with each save's blocked time.

    Examples:
        >>> now = [0.0]
        >>> timer = SaveTimer(every_n_minutes=1, mtbi_hours=None, clock=lambda: now[0])
        >>> now[0] = 59.0; timer.due()
        False
        >>> now[0] = 60.0; timer.due()
        True
    """

    def __init__(
        self,
        every_n_minutes: float | Literal["auto"],
        mtbi_hours: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_n_minutes = every_n_minutes
        self.cadence = AutoCadence(mtbi_hours * 3600.0) if every_n_minutes == "auto" and mtbi_hours else None
        self.clock = clock
        self._last = clock()

    def interval_seconds(self) -> float:
        if self.cadence is not None:
            return self.cadence.interval_seconds()
        return float(self.every_n_minutes) * 60.0

    def due(self) -> bool:
        """Whether the interval has passed since the last save (or :meth:`restart`) on this rank's clock."""
        return self.clock() - self._last >= self.interval_seconds()

    def restart(self) -> None:
        """Count the interval from now."""
        self._last = self.clock()

    def record(self, blocked_seconds: float) -> str | None:
        """A save that blocked training this long just ended: restart, and feed the automatic cadence; returns a line
        to log when that moved its interval by more than 10 %."""
        self.restart()
        if self.cadence is None:
            return None
        before = self.cadence.interval_seconds()
        self.cadence.record(blocked_seconds)
        if abs(self.cadence.interval_seconds() - before) <= 0.1 * before:
            return None
        return (
            f"saving every {self.interval_seconds() / 60:.1f} min (save {self.cadence.save_seconds:.2f} s, "
            f"{self.cadence.mtbi_seconds / 3600:g} h between interruptions; Young/Daly)"
        )
