"""A hung rank, told by its peers: behind them, with all of them waiting.

Under DDP the ranks move in lockstep: when one stops (deadlocked, stuck in its data loading or its own code, frozen),
the others reach their next collective and wait there. Each rank's progress marks then stand still, and the hung rank's
count is behind the others'. :class:`PeerHangJudge` names such a rank once every count has stood still for the
ranks' own allowance (a multiple of their slowest recent step, see ``HangWatchdog``): long before a lone rank's
watchdog, which cannot tell waiting from hanging, gives up. Ranks in phases whose length nothing predicts (start-up,
an epoch's first batch, validation, a checkpoint save) are never named, and equal counts name nobody (every rank in
the same long phase, or all of them stuck in the same place: ``HangWatchdog``'s case).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from lightning_scale.restart.beacon import Progress

__all__ = ["PeerHangJudge"]


class PeerHangJudge:
    """Names the ranks hung behind their waiting peers, from each rank's :class:`Progress` over time.

    Args:
        world_size: Ranks of the job.
        clock: Monotonic seconds.

    Examples:
        >>> now = [0.0]
        >>> judge = PeerHangJudge(2, clock=lambda: now[0])
        >>> judge.observe([Progress(9, True, 10.0), Progress(8, True, 10.0)])
        []
        >>> now[0] = 11.0
        >>> judge.observe([Progress(9, True, 10.0), Progress(8, True, 10.0)])  # rank 1 is one mark behind
        [(1, 11.0)]
    """

    def __init__(self, world_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.world_size = world_size
        self.clock = clock
        self._since: list[tuple[int, float] | None] = [None] * world_size  # per rank: its count, since when

    def observe(self, progress: Sequence[Progress | None]) -> list[tuple[int, float]]:
        """Each rank's latest progress (``None``: not known yet); the hung ranks with how long they stood still."""
        now = self.clock()
        for rank, seen in enumerate(progress):
            if seen is not None and (self._since[rank] is None or self._since[rank][0] != seen.count):  # type: ignore[index]
                self._since[rank] = (seen.count, now)
        known = [(rank, seen) for rank, seen in enumerate(progress) if seen is not None]
        if len(known) < self.world_size:
            return []
        top = max(seen.count for _, seen in known)
        allowance = max((seen.allowance_s for _, seen in known if seen.watched), default=math.inf)
        still = {rank: now - since[1] for rank, since in enumerate(self._since) if since is not None}
        leaders_still = min(still[rank] for rank, seen in known if seen.count == top)
        if leaders_still <= allowance:
            return []
        return [
            (rank, still[rank]) for rank, seen in known if seen.watched and seen.count < top and still[rank] > allowance
        ]
