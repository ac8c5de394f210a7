"""The rest of an epoch on another world size: every remaining sample once, every rank the same steps, and the
global batches a run on the new world size would have taken."""

from __future__ import annotations

import itertools
import math

import pytest
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import BatchSampler, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from lightning_scale.data import EpochSeededSampler
from lightning_scale.data.elastic import (
    EpochPosition,
    RestOfEpochSampler,
    epoch_position,
    global_order,
    order_differences,
    rest_of_epoch,
)


def batches_of(sampler, batch_size: int, drop_last: bool = False) -> list[list[int]]:
    return list(BatchSampler(sampler, batch_size, drop_last))


def position_after(n: int, world: int, batch: int, batches: int, epoch: int = 1, drop_last: bool = False):
    sampler = DistributedSampler(range(n), num_replicas=world, rank=0, seed=11)
    steps = math.ceil(n / world / batch) if not drop_last else n // world // batch
    return epoch_position(
        sampler,
        epoch=epoch,
        batches=batches,
        max_batches=steps,
        batch_size=batch,
        drop_last=drop_last,
        accumulate_grad_batches=1,
    )


@pytest.mark.parametrize(
    ("n", "batch", "old", "new"), list(itertools.product([37, 64, 101], [1, 4], [1, 2, 4], [1, 2, 3]))
)
def test_every_sample_of_the_epoch_is_seen_once_and_every_rank_takes_the_same_steps(n, batch, old, new):
    order = global_order(DistributedSampler(range(n), num_replicas=old, rank=0, seed=11), epoch=1)
    steps_old = math.ceil(n / old / batch)
    for batches in range(steps_old):
        start = position_after(n, old, batch, batches)
        consumed = order[: start.consumed]  # what the old world took: the prefix of the global order
        shares = [rest_of_epoch(order, start, new, rank) for rank in range(new)]
        seen = consumed + [index for share in shares for index in share.indices]
        repeated = shares[0].repeated
        left = order[start.consumed :]
        assert sorted(seen) == sorted(list(range(n)) + (left * repeated)[:repeated])
        assert len({len(batches_of(share.indices, batch)) for share in shares}) == 1  # the same steps everywhere
        assert {share.batches for share in shares} == {len(batches_of(shares[0].indices, batch))}
        last = (n - start.consumed) % (new * batch)  # repeats only to give every rank a sample of the last step, as
        assert repeated == (new - last if 0 < last < new else 0)  # DistributedSampler pads an epoch to the ranks


def test_the_old_worlds_batches_are_the_prefix_of_the_global_order():
    n, world, batch = 50, 4, 3
    order = global_order(DistributedSampler(range(n), num_replicas=world, rank=0, seed=5), epoch=2)
    per_rank = []
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=5)
        sampler.set_epoch(2)
        per_rank.append(batches_of(sampler, batch))
    for k in range(len(per_rank[0])):
        taken = sorted(index for rank in range(world) for b in per_rank[rank][:k] for index in b)
        assert taken == sorted(order[: k * batch * world])


def test_full_global_batches_are_those_of_a_run_on_the_new_world_size():
    n, batch = 96, 4
    order = global_order(DistributedSampler(range(n), num_replicas=2, rank=0, seed=3), epoch=0)
    start = position_after(n, 2, batch, batches=4, epoch=0)  # 32 samples taken by 2 ranks
    for new in (1, 4):
        shares = [batches_of(rest_of_epoch(order, start, new, rank).indices, batch) for rank in range(new)]
        for step in range(len(shares[0])):
            global_batch = sorted(index for share in shares for index in share[step])
            first = start.consumed + step * new * batch
            assert global_batch == sorted(order[first : first + new * batch])


def test_the_loop_counts_the_batches_behind_the_new_world_and_the_position_moves_on():
    start = position_after(100, 2, 4, batches=5)  # 40 of 100 consumed
    rest = rest_of_epoch(list(range(100)), start, 1, 0)
    assert (rest.batches_before, rest.batches) == (10, 15)  # the new world's loop is at batch 10 of 25
    assert rest.position(13).consumed == 40 + 3 * 4
    assert rest.position(25).consumed == 100


def test_drop_last_drops_the_partial_last_global_batch():
    start = position_after(38, 2, 4, batches=2, drop_last=True)
    assert (start.consumed, start.end) == (16, 32)  # each rank had 19 samples: 4 batches of 4
    shares = [rest_of_epoch(list(range(38)), start, 3, rank) for rank in range(3)]
    assert [share.indices for share in shares] == [[16, 19, 22, 25], [17, 20, 23, 26], [18, 21, 24, 27]]
    assert all(share.batches == 1 for share in shares)  # 16 left: one global batch of 3 x 4, 4 samples dropped


def test_global_order_sees_the_users_sampler_inside_lightnings_wrapper():
    inner = EpochSeededSampler(RandomSampler(range(30)), seed=9)
    wrappers = [DistributedSamplerWrapper(inner, num_replicas=3, rank=rank, seed=0) for rank in range(3)]
    order = global_order(wrappers[0], epoch=4)
    for rank, wrapper in enumerate(wrappers):
        wrapper.set_epoch(4)
        assert list(wrapper) == order[rank::3]
    assert sorted(order) == list(range(30))


def test_rest_of_epoch_sampler_is_as_long_as_the_resumed_epoch_and_then_the_samplers_own():
    sampler = DistributedSampler(range(20), num_replicas=1, rank=0, shuffle=False)
    start = EpochPosition(
        epoch=2, consumed=8, end=20, batch_size=4, drop_last=False, samples_per_step=8, shuffle=False, seed=0
    )
    wrapped = RestOfEpochSampler(sampler, rest_of_epoch(list(range(20)), start, 1, 0))
    assert len(wrapped) == 20 and list(wrapped) == list(range(8, 20))
    wrapped.set_epoch(3)
    assert list(wrapped) == list(range(20)) and sampler.epoch == 3


def test_what_keeps_a_sampler_from_the_checkpoints_order_is_named_with_both_values():
    start = EpochPosition(epoch=0, consumed=8, end=16, batch_size=2, drop_last=False, samples_per_step=4,
                          shuffle=True, seed=3)  # fmt: skip
    assert order_differences(DistributedSampler(range(16), num_replicas=1, rank=0, seed=3), start) == {}
    other = DistributedSampler(range(16), num_replicas=3, rank=2, shuffle=False, seed=4)
    assert order_differences(other, start) == {
        "shuffle": "shuffle=False here, shuffle=True in the run that wrote the checkpoint",
        "seed": "seed=4 here, seed=3 in the run that wrote the checkpoint",
    }
    assert order_differences(EpochSeededSampler(RandomSampler(range(16)), seed=3), start) == {
        "sampler": "it draws through EpochSeededSampler here, through a DistributedSampler in the run that wrote the "
        "checkpoint"
    }
