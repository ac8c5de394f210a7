"""How many training steps apart memory snapshots are, from what a snapshot and a step cost here.

A snapshot costs training ``C`` seconds, a step takes ``S``. Snapshotting every ``k`` steps costs ``C / (k S)`` of the
step time and loses ``k S / 2`` on average per failure. ``k`` is the smallest number of steps that keeps the cost
within ``max_overhead``; given a mean time between failures ``M``, it is at least the Young/Daly interval
``sqrt(2 C M)`` in steps, which wastes the least time overall. A small state (``C`` well under ``max_overhead · S``)
is snapshot every step.

``C`` is measured, in two parts: the time training waits for the copy into memory, and, where each snapshot is also
sent to another node on threads beside training, what the steps that ran beside that copy took beyond a step with no
copy (their mean difference times their number). On a GPU node the copy runs on otherwise idle cores and the second
part is about nothing; in CPU training with every core busy, it is most of ``C``.
"""

from __future__ import annotations

import math

from lightning_scale.checkpoint.cadence import young_daly_interval_seconds
from lightning_scale.errors import ConfigurationError

__all__ = ["SnapshotCadence"]

_SMOOTHING = 0.2  # weight of the newest step time in the running mean


class SnapshotCadence:
    """Steps between two snapshots: ``every_n_steps``, or chosen from the measured costs (``None``).

    Args:
        every_n_steps: A fixed number of steps, or ``None`` to choose it from the measured costs.
        max_overhead: The largest share of step time that snapshots may take (``None`` and ``every_n_steps``).
        mtbf_seconds: Mean time between failures, for the Young/Daly interval (``None``: not known).

    Examples:
        >>> cadence = SnapshotCadence(None, max_overhead=0.02)
        >>> cadence.steps()  # nothing measured yet: every step
        1
        >>> cadence.record_step(0.25); cadence.record_snapshot(0.015); cadence.steps()
        3
        >>> cadence.record_step(0.3, copying=True); cadence.record_copy(2)  # 2 steps 50 ms slower beside the copy
        >>> round(cadence.cost_seconds(), 3), cadence.steps()
        (0.115, 23)
    """

    def __init__(self, every_n_steps: int | None, max_overhead: float, mtbf_seconds: float | None = None) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ConfigurationError(f"every_n_steps={every_n_steps} must be >= 1.")
        if not 0 < max_overhead < 1:
            raise ConfigurationError(f"max_overhead={max_overhead} must be between 0 and 1 (a share of the step time).")
        if mtbf_seconds is not None and mtbf_seconds <= 0:
            raise ConfigurationError(f"mtbf_seconds={mtbf_seconds} must be > 0.")
        self.every_n_steps = every_n_steps
        self.max_overhead = max_overhead
        self.mtbf_seconds = mtbf_seconds
        self.step_seconds: float | None = None
        """Running mean of a step with no snapshot and no copy beside it."""
        self.copying_step_seconds: float | None = None
        """Running mean of a step with a copy to another node beside it."""
        self.copy_steps: int | None = None
        """Steps that the latest copy to another node ran beside."""
        self.snapshot_seconds: float | None = None

    def record_step(self, seconds: float, copying: bool = False) -> None:
        """One training step took ``seconds`` (without a snapshot); ``copying``: a copy to another node ran beside
        it."""
        if copying:
            self.copying_step_seconds = _mean(self.copying_step_seconds, seconds)
        else:
            self.step_seconds = _mean(self.step_seconds, seconds)

    def record_snapshot(self, seconds: float) -> None:
        """One snapshot blocked training for ``seconds``."""
        self.snapshot_seconds = seconds

    def record_copy(self, steps: int) -> None:
        """The latest copy to another node ran beside ``steps`` training steps."""
        self.copy_steps = steps

    def cost_seconds(self) -> float | None:
        """What one snapshot costs training (``None``: not measured yet; see the module's description)."""
        if self.snapshot_seconds is None:
            return None
        beside = 0.0
        if self.copy_steps and self.copying_step_seconds is not None and self.step_seconds is not None:
            beside = max(0.0, self.copying_step_seconds - self.step_seconds) * self.copy_steps
        return self.snapshot_seconds + beside

    def steps(self) -> int:
        """Steps from one snapshot to the next."""
        if self.every_n_steps is not None:
            return self.every_n_steps
        cost = self.cost_seconds()
        # with a copy beside every step (every step snapshot), a step with none is measured once the cadence allows
        step = self.step_seconds or self.copying_step_seconds
        if not step or cost is None:
            return 1
        interval = cost / self.max_overhead
        if self.mtbf_seconds is not None:
            interval = max(interval, young_daly_interval_seconds(cost, self.mtbf_seconds))
        return max(1, math.ceil(interval / step))


def _mean(previous: float | None, seconds: float) -> float:
    return seconds if previous is None else (1 - _SMOOTHING) * previous + _SMOOTHING * seconds
