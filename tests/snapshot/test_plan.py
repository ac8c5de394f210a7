"""Which memory snapshot a restarted job resumes from: the newest every rank can load, agreed by all."""

from __future__ import annotations

from lightning_scale.snapshot.plan import plan_restore
from lightning_scale.snapshot.slots import SnapshotHeader


def _h(
    rank: int, step: int, world: int = 2, generation: int = 0, run_id: str = "run", portable: bool = False
) -> SnapshotHeader:
    return SnapshotHeader(rank, world, step, 0, generation, run_id, 0, 0.0, {}, portable)


def test_the_newest_step_every_rank_has_wins_and_each_rank_reads_its_own_where_its_node_holds_it():
    # rank 1 died in the middle of its step-6 snapshot: step 4 is the newest that both ranks have
    plan = plan_restore([[_h(0, 4), _h(0, 6)], [_h(1, 4)]], durable=None)
    assert plan is not None and plan.step == 4 and plan.sources == [0, 1] and plan.transfers() == []
    assert plan.header.rank == 0


def test_a_rank_whose_node_lost_its_memory_receives_its_snapshot_from_the_node_that_keeps_a_copy():
    # rank 1's node was replaced: its memory is empty, rank 0's node keeps a copy of rank 1's snapshots
    plan = plan_restore([[_h(0, 4), _h(1, 4), _h(0, 6), _h(1, 6)], []], durable=(0, 5))
    assert plan is not None and plan.step == 6 and plan.sources == [0, 0] and plan.transfers() == [(0, 1)]


def test_durable_storage_wins_when_newer_memory_when_as_new():
    inventories = [[_h(0, 4)], [_h(1, 4)]]
    assert plan_restore(inventories, durable=(0, 5)) is None
    assert plan_restore(inventories, durable=(1, 2)) is None  # a newer generation
    assert plan_restore(inventories, durable=(0, 4)) is not None


def test_snapshots_of_another_world_size_generation_or_run_do_not_mix():
    assert plan_restore([[_h(0, 4, world=4)], [_h(1, 4, world=4)]], durable=None) is None
    assert plan_restore([[_h(0, 4, run_id="a")], [_h(1, 4, run_id="b")]], durable=None) is None
    plan = plan_restore([[_h(0, 9), _h(0, 2, generation=1)], [_h(1, 9), _h(1, 2, generation=1)]], durable=None)
    assert plan is not None and plan.key == (1, 2)
    assert plan_restore([[], []], durable=None) is None


def test_on_another_world_size_every_rank_loads_old_rank_zeros_snapshot_when_every_rank_held_the_whole_state():
    # 2 processes lost one: the one left holds old rank 0's (its own or a copy) and old rank 1's
    portable = [[_h(0, 8, portable=True), _h(1, 8, portable=True), _h(0, 6, portable=True)]]
    plan = plan_restore(portable, durable=(0, 6))
    assert plan is not None and plan.step == 8 and plan.loads == [0] and plan.transfers() == []
    # grown back to 3: the new ranks 1 and 2 receive old rank 0's snapshot from rank 0's node
    plan = plan_restore([[_h(0, 8, world=1, portable=True)], [], []], durable=None)
    assert plan is not None and plan.loads == [0, 0, 0] and plan.transfers() == [(0, 1), (0, 2)]
    # ZeRO shares or old rank 0's snapshot missing: durable checkpoints
    assert plan_restore([[_h(0, 8), _h(1, 8)]], durable=(0, 6)) is None
    assert plan_restore([[_h(1, 8, portable=True)]], durable=(0, 6)) is None
    # a snapshot of this world size wins over one as new of another
    mixed = [[_h(0, 8, world=1, portable=True), _h(0, 8, world=2, portable=True)], [_h(1, 8, world=2, portable=True)]]
    plan = plan_restore(mixed, durable=None)
    assert plan is not None and plan.loads == [0, 1] and plan.header.world_size == 2
