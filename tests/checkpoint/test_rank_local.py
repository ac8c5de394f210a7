"""Per-rank values of a checkpoint: gathered outside a sharded save, kept with their rank inside one, read back
lazily rank by rank."""

from __future__ import annotations

from lightning_scale.checkpoint.rank_local import (
    RankLocal,
    materialize,
    per_rank,
    put_rank_local,
    rank_local_values,
    saving_per_rank,
    take_rank_local,
)


def test_outside_a_sharded_save_a_value_is_gathered_and_inside_it_stays_with_its_rank():
    assert per_rank({"a": 1}) == [{"a": 1}] and not saving_per_rank()  # one process: rank 0 gets every rank's
    with rank_local_values():
        assert saving_per_rank() and per_rank({"a": 1}) == RankLocal({"a": 1})
    assert not saving_per_rank()


def test_taken_out_and_put_back_each_rank_is_read_once_when_first_used():
    checkpoint = {"callbacks": {"data": {"ranks": RankLocal("mine"), "world_size": 1}}, "more": [RankLocal(7)]}
    stripped, mine = take_rank_local(checkpoint)
    assert mine == ["mine", 7] and "RankLocal" not in repr(stripped)
    files = {0: ["rank 0's", 70], 1: ["rank 1's", 71]}
    reads: list[int] = []

    def read(rank: int) -> list:
        reads.append(rank)
        return files[rank]

    stripped["callbacks"]["data"]["ranks"]["lightning_scale_rank_local"]["world_size"] = 2  # as if saved by 2 ranks
    stripped["more"][0]["lightning_scale_rank_local"]["world_size"] = 2
    loaded = put_rank_local(stripped, read)
    ranks = loaded["callbacks"]["data"]["ranks"]
    assert reads == [] and len(ranks) == 2
    assert ranks[1] == "rank 1's" and loaded["more"][0][1] == 71 and reads == [1]  # rank 1's file, once
    assert materialize(loaded) == {
        "callbacks": {"data": {"ranks": ["rank 0's", "rank 1's"], "world_size": 1}},
        "more": [[70, 71]],
    }
    assert reads == [1, 0]
