"""Which memory snapshot a restarted job resumes from: the newest step that every rank can load, all ranks agreeing.

Every rank lists the snapshots its node holds (its own ranks' and the copies it keeps for ranks on other nodes); the
lists are gathered on every rank, and :func:`plan_restore` — the same pure function on the same input everywhere —
picks the newest ``(generation, step)`` that every rank of the new world can load, unless the newest durable
checkpoint is newer:

- on the world size that wrote it, rank ``r`` loads old rank ``r``'s snapshot;
- on another world size (an elastic job that lost or gained nodes), only a snapshot whose state every rank holds
  whole (``portable``: ``ddp``-like strategies without ZeRO or PowerSGD) is used: every rank loads old rank 0's,
  whose data position is the one an epoch resumed elsewhere starts from (``DataStateCheckpoint``).

Each rank then reads its snapshot from its own node, or receives it from a rank whose node holds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lightning_scale.snapshot.slots import SnapshotHeader

__all__ = ["RestorePlan", "plan_restore"]


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """Resume from memory: the snapshots of ``run_id`` at ``key`` (``(generation, step)``); rank ``r`` loads old rank
    ``loads[r]``'s snapshot from the node of rank ``sources[r]`` (``r`` itself when its node holds it)."""

    key: tuple[int, int]
    run_id: str
    loads: list[int]
    sources: list[int]
    header: SnapshotHeader  # old rank 0's, for the banner

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
    ``r``), or ``None``: no snapshot every rank can load, or the durable checkpoint at ``durable``
    (``(generation, step)``) is newer. A snapshot as new as the durable checkpoint is preferred (it loads faster), and
    one of this world size over one of another.

    Examples:
        >>> def h(rank, step, world=2): return SnapshotHeader(rank, world, step, 0, 0, "run", 0, 0.0, {}, True)
        >>> plan = plan_restore([[h(0, 4), h(0, 6), h(1, 6)], [h(1, 4)]], durable=(0, 2))
        >>> plan.step, plan.loads, plan.sources, plan.transfers()  # rank 1's step-6 snapshot is on rank 0's node
        (6, [0, 1], [0, 0], [(0, 1)])
        >>> plan_restore([[h(0, 4)], [h(1, 4)]], durable=(0, 5)) is None
        True
        >>> plan_restore([[h(0, 8, world=4), h(2, 8, world=4)]], durable=(0, 5)).loads  # on 1 process: rank 0's
        [0]
    """
    world = len(inventories)
    holders: dict[
        tuple[tuple[int, int], str, int], dict[int, list[int]]
    ] = {}  # (key, run, old world) -> rank -> holders
    headers: dict[tuple[tuple[int, int], str, int], SnapshotHeader] = {}
    for holder, listed in enumerate(inventories):
        for header in listed:
            found = (header.key, header.run_id, header.world_size)
            holders.setdefault(found, {}).setdefault(header.rank, []).append(holder)
            if header.rank == 0:
                headers[found] = header
    plans = []
    for found, ranks in holders.items():
        key, run_id, old_world = found
        if old_world == world and len(ranks) == world:
            loads = list(range(world))
        elif old_world != world and 0 in ranks and headers[found].portable:
            loads = [0] * world
        else:
            continue
        sources = [rank if rank in ranks[old] else min(ranks[old]) for rank, old in enumerate(loads)]
        plans.append(((key, old_world == world, run_id), RestorePlan(key, run_id, loads, sources, headers[found])))
    if not plans:
        return None
    _, plan = max(plans, key=lambda item: item[0])
    return None if durable is not None and durable > plan.key else plan
