"""Which rank holds the others back: :class:`StragglerTally` judges windows of per-rank busy time.

In a data-parallel step every rank waits, in the gradient all-reduce, for the slowest one. A rank's **busy** time is
its step time minus that wait (its data loading, forward and backward); the others wait, each step, about the
difference between the slowest rank's busy time and their own. A rank whose busy time is ``factor`` times the median
of the others' in ``patience`` consecutive windows is a straggler; the share of the job's rank-time spent waiting
for it, times the job's price, is what it costs.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from lightning_scale.errors import ConfigurationError

__all__ = ["StragglerTally", "WindowVerdict"]


@dataclasses.dataclass(frozen=True)
class WindowVerdict:
    """One window judged.

    Attributes:
        slowest_rank: The rank with the most busy time.
        slowdown: Its busy time over the median of the other ranks' (1.0 on one rank).
        idle_fraction: The share of the job's rank-time spent waiting for the slowest rank.
        straggler: ``slowest_rank`` when it has been slow in ``patience`` consecutive windows, else ``None``.
    """

    slowest_rank: int
    slowdown: float
    idle_fraction: float
    straggler: int | None


class StragglerTally:
    """Judges each window's per-rank busy seconds and remembers who was persistently slow.

    Args:
        factor: Slowdown (busy time over the others' median) from which a rank counts as slow; > 1.
        patience: Consecutive slow windows of the same rank before it is named a straggler; >= 1.

    Examples:
        >>> tally = StragglerTally(factor=1.5, patience=2)
        >>> tally.judge([1.0, 2.0], wall_seconds=2.0).straggler is None  # slow once
        True
        >>> verdict = tally.judge([1.0, 2.0], wall_seconds=2.0)
        >>> verdict.straggler, verdict.slowdown, verdict.idle_fraction
        (1, 2.0, 0.25)
    """

    def __init__(self, factor: float = 1.2, patience: int = 3) -> None:
        if not factor > 1.0:
            raise ConfigurationError(f"factor={factor} must be > 1: a rank is slow when it is this many times slower.")
        if patience < 1:
            raise ConfigurationError(f"patience={patience} must be >= 1 (windows in a row).")
        self.factor, self.patience = factor, patience
        self._candidate: int | None = None
        self._streak = 0
        self.slow_windows: dict[int, int] = {}
        """Per rank, the windows in which it was slow."""
        self.windows = 0
        """Windows judged."""
        self.usd = 0.0
        """What waiting for stragglers cost: the windows where a straggler was slow, the ``patience`` slow windows
        that made it one included (a single slow window of a balanced job costs nothing)."""
        self._streak_usd = 0.0

    def judge(self, busy_seconds: Sequence[float], wall_seconds: float, usd: float = 0.0) -> WindowVerdict:
        """One window: every rank's busy seconds (indexed by rank), the window's wall-clock seconds and what the
        window cost the job (``usd``: its idle fraction of that goes to :attr:`usd` if a straggler caused it)."""
        self.windows += 1
        slowest = max(range(len(busy_seconds)), key=lambda rank: busy_seconds[rank])
        others = [busy for rank, busy in enumerate(busy_seconds) if rank != slowest]
        if not others:
            return WindowVerdict(slowest, 1.0, 0.0, None)
        median = statistics.median(others)
        slowdown = busy_seconds[slowest] / median if median > 0 else 1.0
        waits = sum(busy_seconds[slowest] - busy for busy in others)
        idle = waits / (len(busy_seconds) * wall_seconds) if wall_seconds > 0 else 0.0
        idle = min(idle, 1.0)
        if slowdown >= self.factor:
            continued = slowest == self._candidate
            self._streak = self._streak + 1 if continued else 1
            self._streak_usd = idle * usd + (self._streak_usd if continued else 0.0)
            self._candidate = slowest
            self.slow_windows[slowest] = self.slow_windows.get(slowest, 0) + 1
        else:
            self._candidate, self._streak, self._streak_usd = None, 0, 0.0
        straggler = slowest if self._streak >= self.patience else None
        if straggler is not None:
            self.usd += self._streak_usd
            self._streak_usd = 0.0
        return WindowVerdict(slowest, slowdown, idle, straggler)
