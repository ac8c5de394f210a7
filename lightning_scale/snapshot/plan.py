"""Which memory snapshot a restarted job resumes from: the newest step that every rank can load, all ranks agreeing.

Every rank lists the snapshots its node holds (its own ranks' and the copies it keeps for ranks on other nodes); the
lists are gathered on every rank, and :func:`plan_restore` — the same pure function on the same input everywhere —
picks the newest ``(generation, step)`` for which every rank of the new world finds its own old rank's snapshot on
some node, unless the newest durable checkpoint is newer. Each rank then reads its snapshot from its own node, or
receives it from a rank whose node holds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lightning_scale.snapshot.slots import SnapshotHeader

__all__ = ["RestorePlan", "plan_restore"]


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """Resume from memory: the snapshots of ``run_id`` at ``key`` (``(generation, step)``), rank ``r`` reading its
    own from the node of rank ``sources[r]`` (``r`` itself when its node holds it)."""

    key: tuple[int, int]
    run_id: str
    sources: list[int]
    header: SnapshotHeader  # rank 0's, for the banner

    @property
    def step(self) -> int:
        return self.key[1]

    def transfers(self) -> list[tuple[int, int]]:
        """``(sender, receiver)`` for each rank whose snapshot is on another node, in rank order."""
        return [(source, rank) for rank, source in enumerate(self.sources) if source != rank]


def plan_restore(
    inventories: Sequence[Sequence[SnapshotHeader]], durable: tuple[int, int] | None
) -> RestorePlan | None:
    """The memory snapshot to resume from, given what each rank's node holds (``inventories[r]``, listed by rank
    ``r``), or ``None``: no snapshot every rank can load of this world size, or the durable checkpoint at
    ``durable`` (``(generation, step)``) is newer. A snapshot as new as the durable checkpoint is preferred: it loads
    faster.

    Example:
        >>> def h(rank, step): return SnapshotHeader(rank, 2, step, 0, 0, "run", 0, 0.0, {})
        >>> plan = plan_restore([[h(0, 4), h(0, 6), h(1, 6)], [h(1, 4)]], durable=(0, 2))
        >>> plan.step, plan.sources, plan.transfers()  # rank 1's step-6 snapshot is on rank 0's node only
        (6, [0, 0], [(0, 1)])
        >>> plan_restore([[h(0, 4)], [h(1, 4)]], durable=(0, 5)) is None
        True
    """
    world = len(inventories)
    holders: dict[tuple[tuple[int, int], str], dict[int, list[int]]] = {}
    headers: dict[tuple[tuple[int, int], str], SnapshotHeader] = {}
    for holder, listed in enumerate(inventories):
        for header in listed:
            if header.world_size != world or not 0 <= header.rank < world:
                continue
            found = (header.key, header.run_id)
            holders.setdefault(found, {}).setdefault(header.rank, []).append(holder)
            if header.rank == 0:
                headers[found] = header
    complete = [found for found, ranks in holders.items() if len(ranks) == world]
    if not complete:
        return None
    key, run_id = max(complete)
    if durable is not None and durable > key:
        return None
    ranks = holders[(key, run_id)]
    sources = [rank if rank in ranks[rank] else min(ranks[rank]) for rank in range(world)]
    return RestorePlan(key, run_id, sources, headers[(key, run_id)])
