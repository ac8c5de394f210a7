"""How often to checkpoint: the Young/Daly first-order optimum from the measured save cost and the expected time
between interruptions. Plain arithmetic, no Lightning.

Saving every ``T`` seconds costs ``C/T`` of the time in saves, and an interruption loses ``T/2`` on average, so with
a mean time between interruptions ``M`` the waste ``C/T + T/(2M)`` is least at ``T = sqrt(2 C M)`` (Young 1974,
Daly 2006; first order, valid while ``C`` is small against ``M``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

__all__ = ["AutoCadence", "young_daly_interval_seconds"]


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

    Example:
        >>> cadence = AutoCadence(mtbi_seconds=7200, initial_save_seconds=10)
        >>> round(cadence.interval_seconds())
        379
        >>> cadence.record(2.5)
        >>> round(cadence.interval_seconds())
        190
    """

    def __init__(self, mtbi_seconds: float, initial_save_seconds: float = 10.0, window: int = 5) -> None:
        if not mtbi_seconds > 0:
            raise ValueError(f"the mean time between interruptions must be > 0 (got {mtbi_seconds} s).")
        if window < 1:
            raise ValueError(f"window={window} must be >= 1.")
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
