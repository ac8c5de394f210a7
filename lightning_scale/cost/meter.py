"""The cost meter: wall time billed at an hourly rate, across restarts, with busy time, waste and projections."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from lightning_scale.errors import ConfigurationError

__all__ = ["CostMeter", "CostReport"]


@dataclass(frozen=True)
class CostReport:
    """What a run cost so far. ``None`` where the figure is not known yet (no step, no sample, no target)."""

    usd_total: float
    usd_per_hour: float
    usd_per_step: float | None
    usd_per_1k_samples: float | None
    projected_usd: float | None
    preemption_waste_usd: float
    savings_vs_on_demand_usd: float | None
    idle_fraction: float
    hours: float

    def metrics(self, prefix: str = "cost/") -> dict[str, float]:
        """The known figures as ``{"cost/usd_total": ..., ...}``."""
        return {f"{prefix}{key}": value for key, value in asdict(self).items() if value is not None}


class CostMeter:
    """Bills wall time at ``usd_per_hour`` from the first start of a run to now, across restarts.

    The billed time is the sum of the attempts' running time plus, for each restart, the gap between the checkpoint
    it resumed from and the new start (the work lost since that checkpoint plus the restart itself), up to
    ``max_restart_gap_seconds`` per gap: a longer gap is a job that waited or was resumed by hand later, when no
    machine was held. Those gaps are the preemption waste. Busy time is time inside training steps; the rest (data
    waits, checkpoint saves, validation, restarts) is idle.

    Each attempt bills its own time at its own rate: a job that resumes on fewer or more nodes (an elastic job) keeps
    what the earlier attempts cost and bills its own nodes from its start, and the gap before it at its rate (the
    nodes that waited for it).

    Args:
        usd_per_hour: Price of the whole job per hour (every node), >= 0.
        on_demand_usd_per_hour: On-demand price of the same job, for the savings of spot capacity; ``None``: unknown.
        clock: Wall-clock seconds (like ``time.time``): it must agree across processes, since a restart is measured
            from a time saved by the previous attempt.
        max_restart_gap_seconds: Longest restart gap that is billed.
        rate_window_steps: Steps of recent history used for the projected total.

    Examples:
        >>> now = [0.0]
        >>> meter = CostMeter(usd_per_hour=8.0, clock=lambda: now[0])
        >>> meter.start()
        0.0
        >>> now[0] = 450.0
        >>> meter.report(step=1, total_steps=None).usd_total
        1.0
    """

    def __init__(
        self,
        usd_per_hour: float,
        on_demand_usd_per_hour: float | None = None,
        clock: Callable[[], float] = time.time,
        max_restart_gap_seconds: float = 1800.0,
        rate_window_steps: int = 50,
    ) -> None:
        if not usd_per_hour >= 0 or (on_demand_usd_per_hour is not None and not on_demand_usd_per_hour >= 0):
            raise ConfigurationError(
                f"Prices must be >= 0 USD per hour (got {usd_per_hour}, {on_demand_usd_per_hour})."
            )
        if not max_restart_gap_seconds >= 0:
            raise ConfigurationError(f"max_restart_gap_seconds={max_restart_gap_seconds} must be >= 0.")
        self.usd_per_hour = usd_per_hour
        self.on_demand_usd_per_hour = on_demand_usd_per_hour
        self.clock = clock
        self.max_restart_gap_seconds = max_restart_gap_seconds
        self._closed_seconds = 0.0  # billed time of finished segments and restart gaps
        self._closed_usd = 0.0  # what they cost, each at its own rate
        self._closed_on_demand_usd = 0.0  # what the same time outside the gaps would have cost on demand
        self._busy_seconds = 0.0
        self._waste_seconds = 0.0
        self._waste_usd = 0.0
        self._samples = 0
        self._segment_start: float | None = None
        self._step_start: float | None = None
        self._resume_from: float | None = None  # saved_at of the loaded state, until start() bills the gap
        self._recent: deque[tuple[float, int]] = deque(maxlen=max(2, rate_window_steps))
        self.last_gap_seconds: float | None = None
        """The latest restart gap as measured (before the cap); ``None`` when this meter never resumed."""

    @property
    def running(self) -> bool:
        return self._segment_start is not None

    @property
    def resuming(self) -> bool:
        """A loaded state's restart gap is still to be billed by :meth:`start`."""
        return self._resume_from is not None

    def start(self) -> float:
        """Start (or resume) billing now; returns the restart gap billed, in seconds (0.0 on a fresh start)."""
        now = self.clock()
        billed_gap = 0.0
        if self._resume_from is not None:
            self.last_gap_seconds = max(0.0, now - self._resume_from)
            billed_gap = min(self.last_gap_seconds, self.max_restart_gap_seconds)
            self._closed_seconds += billed_gap
            self._closed_usd += self.usd(billed_gap)
            self._waste_seconds += billed_gap
            self._waste_usd += self.usd(billed_gap)
            self._resume_from = None
        if self._segment_start is None:
            self._segment_start = now
        self._recent.clear()
        return billed_gap

    def stop(self) -> None:
        """Stop billing (the end of fit); :meth:`start` continues without a gap."""
        if self._segment_start is not None:
            elapsed = self.clock() - self._segment_start
            self._closed_seconds += elapsed
            self._closed_usd += self.usd(elapsed)
            self._closed_on_demand_usd += self._on_demand_usd(elapsed)
            self._segment_start = None
        self._step_start = None

    def step_started(self) -> None:
        self._step_start = self.clock()

    def step_ended(self, step: int, samples: int) -> None:
        """A training batch of ``samples`` samples (all ranks together) ended; ``step`` is the optimizer step count."""
        now = self.clock()
        if self._step_start is not None:
            self._busy_seconds += now - self._step_start
            self._step_start = None
        self._samples += samples
        self._recent.append((self.seconds(now), step))

    def seconds(self, now: float | None = None) -> float:
        """Billed wall seconds so far."""
        return self._closed_seconds + self._running_seconds(now)

    def usd_total(self, now: float | None = None) -> float:
        """Billed dollars so far: earlier attempts at their rates, this one at ``usd_per_hour``."""
        return self._closed_usd + self.usd(self._running_seconds(now))

    def usd(self, seconds: float) -> float:
        """``seconds`` at this attempt's rate."""
        return seconds * self.usd_per_hour / 3600.0

    def _on_demand_usd(self, seconds: float) -> float:
        return 0.0 if self.on_demand_usd_per_hour is None else seconds * self.on_demand_usd_per_hour / 3600.0

    def _running_seconds(self, now: float | None) -> float:
        if self._segment_start is None:
            return 0.0
        return (self.clock() if now is None else now) - self._segment_start

    def report(self, step: int, total_steps: int | None) -> CostReport:
        """The cost figures at optimizer step ``step``; ``total_steps`` (if known) gives the projected total."""
        now = self.clock()
        seconds, usd_total = self.seconds(now), self.usd_total(now)
        savings = None
        if self.on_demand_usd_per_hour is not None:
            savings = self._closed_on_demand_usd + self._on_demand_usd(self._running_seconds(now)) - usd_total
        return CostReport(
            usd_total=usd_total,
            usd_per_hour=self.usd_per_hour,
            usd_per_step=usd_total / step if step > 0 else None,
            usd_per_1k_samples=usd_total * 1000.0 / self._samples if self._samples else None,
            projected_usd=self._projected(usd_total, step, total_steps),
            preemption_waste_usd=self._waste_usd,
            savings_vs_on_demand_usd=savings,
            idle_fraction=1.0 - self._busy_seconds / seconds if seconds > 0 else 0.0,
            hours=seconds / 3600.0,
        )

    def _projected(self, usd_total: float, step: int, total_steps: int | None) -> float | None:
        if total_steps is None or step <= 0:
            return None
        remaining = max(0, total_steps - step)
        (first_seconds, first_step), (last_seconds, last_step) = (
            (self._recent[0], self._recent[-1]) if self._recent else ((0.0, 0), (0.0, 0))
        )
        if last_step > first_step:  # the recent rate, so a slow start or a restart does not skew the projection
            return usd_total + remaining * self.usd((last_seconds - first_seconds) / (last_step - first_step))
        return usd_total + remaining * usd_total / step

    def state_dict(self, final: bool = False) -> dict[str, Any]:
        """The meter's totals now, with the time they were taken (the next attempt bills the gap from it).

        ``final``: the run is at its last step, so resuming this state later continues a finished run (no gap).
        """
        now = self.clock()
        if self._resume_from is not None:  # loaded but not started: the gap since the loaded state is still owed
            now = self._resume_from
        running = self._running_seconds(now)
        return {
            "seconds": self.seconds(now),
            "usd": self.usd_total(now),
            "on_demand_usd": self._closed_on_demand_usd + self._on_demand_usd(running),
            "busy_seconds": self._busy_seconds,
            "waste_seconds": self._waste_seconds,
            "waste_usd": self._waste_usd,
            "samples": self._samples,
            "saved_at": now,
            "running": (self.running or self.resuming) and not final,  # after stop() or at the end: no gap owed
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state; the next :meth:`start` bills the gap since it was saved, unless it was saved
        after :meth:`stop` (a finished fit, whose later resumption is no restart)."""
        self._closed_seconds = float(state["seconds"])
        self._busy_seconds = float(state["busy_seconds"])
        self._waste_seconds = float(state["waste_seconds"])
        # states of earlier releases hold seconds only: billed at this attempt's rate, as they were then
        self._closed_usd = float(state.get("usd", self.usd(self._closed_seconds)))
        self._waste_usd = float(state.get("waste_usd", self.usd(self._waste_seconds)))
        on_demand = self._on_demand_usd(self._closed_seconds - self._waste_seconds)
        self._closed_on_demand_usd = float(state.get("on_demand_usd", on_demand))
        self._samples = int(state["samples"])
        self._resume_from = float(state["saved_at"]) if state.get("running", True) else None
        self._segment_start = None
        self._step_start = None
        self._recent.clear()
