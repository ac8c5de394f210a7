"""Elastic resumption for :class:`~lightning_scale.callbacks.DataStateCheckpoint`: a checkpoint written by another
number of processes, the rest of its epoch dealt to the new world (:mod:`lightning_scale.data.elastic`), the samples
per optimizer step kept, and one process drawing its data as DDP would."""

from __future__ import annotations

import dataclasses
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler

from lightning_scale import distributed
from lightning_scale._lightning_internals import (
    consumed_batches_in_epoch,
    ddp_sampler_on_one_process,
    reload_train_loaders_after,
    shift_batches_in_epoch,
)
from lightning_scale.callbacks._data_state_format import RankDataState
from lightning_scale.data.elastic import (
    EpochPosition,
    RestOfEpoch,
    RestOfEpochSampler,
    epoch_position,
    global_order,
    order_differences,
    rest_of_epoch,
)
from lightning_scale.errors import ConfigurationError

__all__ = [
    "data_replicas",
    "ddp_sampler",
    "draws_as_ddp",
    "epoch_position_of",
    "finish_epoch_elsewhere",
    "keep_samples_per_step",
    "rest_of_epoch_sampler",
    "resume_on_another_world",
]

ORDER_FIXES = {
    "sampler": (
        "Give it a DistributedSampler, or leave Trainer(use_distributed_sampler=True) (the default) so that one is "
        "put into its DataLoader: by Lightning under DDP, by DataStateCheckpoint on one process without a parallel "
        "strategy."
    ),
    "shuffle": (
        "Build it with shuffle={start.shuffle} (Lightning's own shuffles every training loader unless overfit_batches "
        "is set)."
    ),
    "seed": (
        "Seed it with {start.seed}: Lightning's DistributedSampler takes seed_everything's seed (0 without one), so "
        "call seed_everything({start.seed}) (lightning-scale fit --seed_everything {start.seed})."
    ),
}
"""Per difference between a loader's order and the checkpoint's (:func:`order_differences`), how to remove it."""


def data_replicas(trainer: pl.Trainer | None) -> int:
    """The ranks that read different batches (every process under DDP; one per model replica under tensor
    parallelism), as the strategy tells Lightning's distributed sampler."""
    if trainer is None:
        return distributed.world_size()
    kwargs = trainer.distributed_sampler_kwargs or {}
    return int(kwargs.get("num_replicas", trainer.world_size))


def epoch_position_of(trainer: pl.Trainer, loader: Any) -> EpochPosition | None:
    """Where the job stands in the epoch's global order through ``loader`` (``None``: not measurable)."""
    batches = consumed_batches_in_epoch(trainer)
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, RestOfEpochSampler):
        position = sampler.rest.position(batches)
        per_step = position.batch_size * trainer.accumulate_grad_batches * sampler.rest.world_size
        return dataclasses.replace(position, samples_per_step=per_step)
    batch_size = getattr(loader, "batch_size", None)
    if not isinstance(sampler, DistributedSampler) or not batch_size:
        return None
    return epoch_position(
        sampler,
        epoch=trainer.current_epoch,
        batches=batches,
        max_batches=trainer.num_training_batches,
        batch_size=batch_size,
        drop_last=bool(loader.drop_last),
        accumulate_grad_batches=trainer.accumulate_grad_batches,
    )


def _elastic_start(
    trainer: pl.Trainer | None, rank0: RankDataState, saved_world: int, world: int, loaders_resumable: bool
) -> EpochPosition:
    position = rank0.first_position
    reason = None
    if position is None:
        reason = (
            "its training data is not one DataLoader with a batch size drawn through a distributed sampler, or "
            "the checkpoint is older than elastic resumption"
        )
    elif not loaders_resumable:
        reason = "DataStateCheckpoint(make_loaders_resumable=False) leaves the loaders as they are"
    elif trainer is not None and trainer.limit_train_batches != 1.0:
        reason = f"limit_train_batches={trainer.limit_train_batches} limits the epoch"
    if reason is not None or position is None:
        raise ConfigurationError(
            f"The checkpoint was written by {saved_world} processes in the middle of epoch {rank0.epoch} "
            f"(after {rank0.batches_consumed} batches per rank), and its epoch cannot be finished on {world} "
            f"processes: {reason}. Resume with {saved_world} processes (Trainer devices/num_nodes, or torchrun "
            "--nproc-per-node), or from a checkpoint taken at the end of an epoch."
        )
    return position


def resume_on_another_world(
    trainer: pl.Trainer,
    rank0: RankDataState,
    saved_world: int,
    world: int,
    checkpoint: dict[str, Any] | None,
    loaders_resumable: bool,
) -> EpochPosition | None:
    """Resume rank 0's state of ``saved_world`` processes on ``world``: the epoch whose rest the training loader deals
    out (:func:`finish_epoch_elsewhere`), or ``None`` for a checkpoint at an epoch's end, whose next epoch is split for
    ``world`` (with a warning that the run no longer follows one that kept its processes)."""
    if not rank0.end_of_epoch:
        return finish_epoch_elsewhere(trainer, rank0, saved_world, world, checkpoint, loaders_resumable)
    rank_zero_warn(
        f"Resuming a checkpoint written by {saved_world} processes with {world}: the next epoch is split for {world} "
        f"processes and the RNG streams are not restored, so this run will not match one that kept {saved_world} "
        "processes."
    )
    return None


def finish_epoch_elsewhere(
    trainer: pl.Trainer | None,
    rank0: RankDataState,
    saved_world: int,
    world: int,
    checkpoint: dict[str, Any] | None,
    loaders_resumable: bool,
) -> EpochPosition:
    """Plan the rest of rank 0's epoch for ``world`` processes and count its batches in ``checkpoint`` as they will
    be; the epoch's position, for the training loader to deal out its rest."""
    start = _elastic_start(trainer, rank0, saved_world, world, loaders_resumable)
    replicas = data_replicas(trainer)
    chunk = replicas * start.batch_size
    left = start.end - start.consumed
    batches = left // chunk if start.drop_last else -(-left // chunk)
    if checkpoint is None:
        raise RuntimeError("DataStateCheckpoint.load_state_dict ran without on_load_checkpoint before it.")
    shift_batches_in_epoch(checkpoint, start.consumed // chunk - rank0.batches_consumed)
    rank_zero_warn(
        f"Resuming epoch {start.epoch} on {world} processes; the checkpoint was written by {saved_world} after "
        f"{start.consumed} of its {start.end} samples. The {left} samples left are dealt to {replicas} "
        f"data-parallel rank(s) ({batches} batches of up to {start.batch_size} each), each seen once; the epochs "
        f"after it are split for {world} processes, and the RNG streams of the old processes are not restored."
    )
    return start


def keep_samples_per_step(trainer: pl.Trainer, saved: RankDataState) -> None:
    """Set ``accumulate_grad_batches`` so that an optimizer step takes the saved run's samples (``keep_global_batch``);
    a world size that cannot is refused."""
    position = (saved.positions or [None])[0]
    if position is None:
        return
    world = data_replicas(trainer)
    per_batch = position.batch_size * world
    accumulate, remainder = divmod(position.samples_per_step, per_batch)
    if remainder or accumulate < 1:
        raise ConfigurationError(
            f"DataStateCheckpoint(keep_global_batch=True): the run's optimizer steps take "
            f"{position.samples_per_step} samples, which {world} processes with batches of {position.batch_size} "
            f"cannot keep ({position.samples_per_step} is no multiple of {per_batch}). Run on a number of "
            "processes that divides it, or set keep_global_batch=False."
        )
    if trainer.accumulate_grad_batches != accumulate:
        rank_zero_warn(
            f"accumulate_grad_batches {trainer.accumulate_grad_batches} -> {accumulate}: {world} processes x "
            f"{position.batch_size} samples x {accumulate} batches keep the run's {position.samples_per_step} "
            "samples per optimizer step (DataStateCheckpoint(keep_global_batch=True))."
        )
        trainer.accumulate_grad_batches = accumulate


def rest_of_epoch_sampler(
    trainer: pl.Trainer, start: EpochPosition, name: str, sampler: Any
) -> tuple[Sampler[int], RestOfEpoch]:
    """``sampler`` (the new world's distributed sampler) dealing out the rest of ``start``'s epoch first, and this
    rank's share of it."""
    differences = order_differences(sampler, start)
    if differences:
        raise ConfigurationError(
            f"Epoch {start.epoch} resumes on {trainer.world_size} processes, but {name} cannot continue the "
            f"order the run that wrote the checkpoint drew it in: {'; '.join(differences.values())}. "
            + " ".join(ORDER_FIXES[kind].format(start=start) for kind in differences)
            + " Or resume on the number of processes that wrote the checkpoint."
        )
    order = global_order(sampler, start.epoch)
    if len(order) < start.end:
        raise ConfigurationError(
            f"{name}'s dataset has {len(order)} samples, fewer than the {start.end} of the epoch being resumed: "
            "resume with the dataset that wrote the checkpoint."
        )
    rest = rest_of_epoch(order, start, sampler.num_replicas, sampler.rank)  # data-parallel ranks
    if rest.repeated:
        rank_zero_warn(
            f"Epoch {start.epoch} has fewer samples left than the {trainer.world_size} processes: "
            f"{rest.repeated} sample(s) are seen twice so that every process takes the last step."
        )
    reload_train_loaders_after(trainer, start.epoch)
    return RestOfEpochSampler(sampler, rest), rest


def draws_as_ddp(trainer: pl.Trainer, saved_distributed: bool | None) -> str | None:
    """Why this fit's single process draws its training data through the sampler DDP would give it (``None``: it
    does not; a parallel strategy injects its own, and a plain run keeps the loader's).

    Lightning injects a distributed sampler under DDP only, and picks a single-device strategy for one process: the
    order of an epoch would change with the world size, and an elastic job that shrinks to one process (or starts on
    one) could neither finish an epoch begun on more nor hand its own to more. ``saved_distributed``: whether the
    checkpoint being resumed drew through a distributed sampler (``None``: no checkpoint, or one that does not say).
    """
    if trainer.distributed_sampler_kwargs is not None:
        return None
    if saved_distributed is not None:
        return "as the checkpoint it resumes drew it" if saved_distributed else None
    return "as the world of this torchrun job may grow" if TorchElasticEnvironment.detect() else None


def ddp_sampler(trainer: pl.Trainer, name: str, why: str, loader: Any) -> Any:
    """The sampler DDP would put into ``loader`` on one process (``None``: none), announced with ``why``."""
    sampler = ddp_sampler_on_one_process(trainer, loader)
    if sampler is not None:
        rank_zero_info(
            f"DataStateCheckpoint: {name} draws through the {type(sampler).__name__} Lightning's DDP would give it "
            f"on one process (shuffle={sampler.shuffle}, seed={sampler.seed}), {why}: its epochs keep the global "
            "order they have on more processes."
        )
    return sampler
