"""The rest of an epoch on another number of processes: every remaining sample once, every rank the same steps.

Under DDP an epoch has one global order, the distributed sampler's for every rank together (it depends on the seed,
the epoch and the dataset only; rank ``r`` of ``W`` takes positions ``r, r + W, ...``). The ranks take their batches
in lockstep, so after ``k`` batches of ``B`` samples the job has consumed exactly the first ``k·B·W`` positions. On
``W'`` processes the rest of the epoch is dealt out one global batch of ``W'·B`` positions at a time, as a ``W'``
run deals its own epochs; the last, partial global batch is spread over every rank, so all ranks take the same number
of steps (which every collective needs). This module is pure torch: :class:`~lightning_scale.callbacks.
DataStateCheckpoint` records :class:`EpochPosition` at every checkpoint and applies :func:`rest_of_epoch` when a
mid-epoch checkpoint resumes on another world size.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler

__all__ = [
    "EpochPosition",
    "RestOfEpoch",
    "RestOfEpochSampler",
    "epoch_position",
    "global_order",
    "order_differences",
    "rest_of_epoch",
]


@dataclasses.dataclass(frozen=True)
class EpochPosition:
    """How far a job got in an epoch's global order.

    Attributes:
        epoch: The epoch.
        consumed: Positions of the global order consumed by all ranks together.
        end: Positions the epoch covers (the dataset, less what ``drop_last`` drops).
        batch_size: Samples per batch and rank.
        drop_last: The loader drops a rank's last, partial batch.
        samples_per_step: Samples of one optimizer step, all ranks together (batch x accumulation x processes).
        shuffle: The distributed sampler shuffles.
        seed: The distributed sampler's seed.
    """

    epoch: int
    consumed: int
    end: int
    batch_size: int
    drop_last: bool
    samples_per_step: int
    shuffle: bool
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochPosition:
        return cls(**data)


def epoch_position(
    sampler: DistributedSampler,
    *,
    epoch: int,
    batches: int,
    max_batches: float,
    batch_size: int,
    drop_last: bool,
    accumulate_grad_batches: int,
) -> EpochPosition:
    """The position after ``batches`` batches per rank of ``epoch``, drawn through ``sampler`` (``max_batches``: the
    epoch's batches per rank, as the training loop counts them).

    Examples:
        >>> sampler = DistributedSampler(range(10), num_replicas=2, rank=0, seed=3)
        >>> position = epoch_position(sampler, epoch=0, batches=2, max_batches=3, batch_size=2, drop_last=False,
        ...                           accumulate_grad_batches=1)
        >>> position.consumed, position.end, position.samples_per_step
        (8, 10, 4)
    """
    world = sampler.num_replicas
    end = sampler.total_size if sampler.drop_last else len(sampler.dataset)  # type: ignore[arg-type]
    if math.isfinite(max_batches):
        end = min(end, int(max_batches) * batch_size * world)
    if drop_last:
        end = min(end, sampler.num_samples // batch_size * batch_size * world)
    return EpochPosition(
        epoch=epoch,
        consumed=min(batches * batch_size * world, end),
        end=end,
        batch_size=batch_size,
        drop_last=drop_last,
        samples_per_step=batch_size * accumulate_grad_batches * world,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
    )


def order_differences(sampler: Any, start: EpochPosition) -> dict[str, str]:
    """What keeps ``sampler`` from drawing the global order of ``start``'s epoch: ``"sampler"`` (not a distributed
    sampler), ``"shuffle"`` or ``"seed"``, each with the values seen on both sides (empty: it draws that order, given
    the same dataset).

    Examples:
        >>> start = EpochPosition(epoch=0, consumed=8, end=18, batch_size=2, drop_last=False, samples_per_step=4,
        ...                       shuffle=True, seed=0)
        >>> order_differences(DistributedSampler(range(18), num_replicas=1, rank=0, seed=7), start)
        {'seed': 'seed=7 here, seed=0 in the run that wrote the checkpoint'}
    """
    theirs = "in the run that wrote the checkpoint"
    if not isinstance(sampler, DistributedSampler):
        return {"sampler": f"it draws through {type(sampler).__name__} here, through a DistributedSampler {theirs}"}
    found = {}
    if sampler.shuffle != start.shuffle:
        found["shuffle"] = f"shuffle={sampler.shuffle} here, shuffle={start.shuffle} {theirs}"
    if sampler.seed != start.seed:
        found["seed"] = f"seed={sampler.seed} here, seed={start.seed} {theirs}"
    return found


def global_order(sampler: DistributedSampler, epoch: int) -> list[int]:
    """``epoch``'s order of ``sampler`` (a ``DistributedSampler`` or a subclass such as Lightning's
    ``DistributedSamplerWrapper``) for all ranks together, without the padding that makes it divide evenly.

    Examples:
        >>> sampler = DistributedSampler(range(5), num_replicas=2, rank=1, seed=0)
        >>> sampler.set_epoch(1)
        >>> order = global_order(sampler, epoch=1)
        >>> sorted(order), list(sampler) == (order + order[:1])[1::2]  # padded to 6, rank 1 takes every 2nd
        ([0, 1, 2, 3, 4], True)
    """
    whole = _one_replica(sampler)
    whole.set_epoch(epoch)
    return list(whole)


def _one_replica(sampler: DistributedSampler) -> DistributedSampler:
    """A copy of ``sampler`` that deals every position to one rank (and pads nothing): its order is the global one."""
    whole = copy.copy(sampler)  # shares the dataset: Lightning's wrapper keeps the user's sampler there
    whole.num_replicas, whole.rank, whole.drop_last = 1, 0, False
    whole.num_samples = whole.total_size = len(sampler.dataset)  # type: ignore[arg-type]
    return whole


@dataclasses.dataclass(frozen=True)
class RestOfEpoch:
    """One rank's share of the rest of an epoch on a new world size.

    Attributes:
        start: Where the job stood when this world took over.
        world_size: Processes of the new world.
        batches_before: The epoch's batches per rank already behind the new world, as its training loop counts them
            (the consumed positions in its own global batches, rounded down).
        indices: This rank's samples, in order.
        batches: This rank's batches (the same on every rank).
        repeated: Samples given twice so that every rank has one in the last step (only when that step has fewer
            samples than ranks, as ``DistributedSampler`` pads an epoch that does not divide among the ranks).
    """

    start: EpochPosition
    world_size: int
    batches_before: int
    indices: list[int]
    batches: int
    repeated: int

    def position(self, batches_in_epoch: int) -> EpochPosition:
        """The position once the training loop counts ``batches_in_epoch`` batches of this epoch."""
        done = (batches_in_epoch - self.batches_before) * self.start.batch_size * self.world_size
        return dataclasses.replace(self.start, consumed=min(self.start.end, self.start.consumed + max(0, done)))


def rest_of_epoch(order: list[int], start: EpochPosition, world_size: int, rank: int) -> RestOfEpoch:
    """Deal the positions ``start.consumed`` to ``start.end`` of ``order`` to ``world_size`` ranks, one global batch
    at a time, rank ``r`` taking every ``world_size``-th sample of each from the ``r``-th on (as
    ``DistributedSampler`` does); a partial last global batch is spread over all ranks, and dropped with
    ``drop_last``.

    Examples:
        >>> start = EpochPosition(epoch=0, consumed=8, end=18, batch_size=2, drop_last=False, samples_per_step=8,
        ...                       shuffle=False, seed=0)
        >>> [rest_of_epoch(list(range(18)), start, 3, rank).indices for rank in range(3)]
        [[8, 11, 14, 17], [9, 12, 15], [10, 13, 16]]
    """
    tail = order[start.consumed : start.end]
    chunk = world_size * start.batch_size
    if start.drop_last:
        tail = tail[: len(tail) // chunk * chunk]
    steps = math.ceil(len(tail) / chunk)
    last = len(tail) - (steps - 1) * chunk if steps else 0
    repeated = world_size - last if 0 < last < world_size else 0
    tail = tail + (tail * repeated)[:repeated]  # cyclically, as DistributedSampler pads
    indices = [index for step in range(steps) for index in tail[step * chunk : (step + 1) * chunk][rank::world_size]]
    return RestOfEpoch(
        start=start,
        world_size=world_size,
        batches_before=start.consumed // chunk,
        indices=indices,
        batches=steps,
        repeated=repeated,
    )


class RestOfEpochSampler(Sampler[int]):
    """Yields this rank's :class:`RestOfEpoch` in its epoch and ``sampler``'s order in any other.

    Its length in that epoch counts the batches already behind (``batches_before · batch_size`` samples) as well, so
    that a loader over it is as long as the epoch the training loop resumes into.
    """

    def __init__(self, sampler: Sampler[int], rest: RestOfEpoch) -> None:
        self.sampler = sampler
        self.rest = rest
        self.epoch = rest.start.epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[int]:
        if self.epoch == self.rest.start.epoch:
            return iter(self.rest.indices)
        return iter(self.sampler)

    def __len__(self) -> int:
        if self.epoch == self.rest.start.epoch:
            return self.rest.batches_before * self.rest.start.batch_size + len(self.rest.indices)
        return len(self.sampler)  # type: ignore[arg-type]
