"""Which format ``ResumableCheckpoint`` writes on a strategy, single files or shards, and the local cache that only
single files can use; the combinations that cannot work are refused with the way that does."""

from __future__ import annotations

from dataclasses import dataclass

from lightning.pytorch.strategies import ModelParallelStrategy, Strategy

from lightning_scale._lightning_internals import writes_sharded_checkpoints
from lightning_scale.callbacks._checkpoint_io import ShardedAwareCheckpointIO, load_from_any_storage
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.errors import ConfigurationError
from lightning_scale.strategies.data_parallel import DataParallelStrategy

__all__ = ["CheckpointFormat", "choose_format", "local_cache"]


@dataclass(frozen=True)
class CheckpointFormat:
    """``sharded``: each checkpoint is a directory of per-rank shards; ``native``: the strategy's own state dict
    holds the shards (and its loader reads directories)."""

    sharded: bool
    native: bool


def choose_format(
    strategy: Strategy, sharded: bool | None, async_save: bool, dirpath: str, fitting: bool
) -> CheckpointFormat:
    """The format for ``strategy`` (``sharded=None``: shards when the strategy shards the state, ZeRO-1's optimizer
    state included). On a strategy that loads single files only, a ``CheckpointIO`` loads sharded checkpoints too
    (such as those of another strategy)."""
    native = writes_sharded_checkpoints(strategy)
    shards_state = native or (isinstance(strategy, DataParallelStrategy) and strategy.zero_stage >= 1)
    chosen = CheckpointFormat(sharded=shards_state if sharded is None else sharded, native=native)
    name = type(strategy).__name__
    if fitting and native and not chosen.sharded:
        raise ConfigurationError(
            f"ResumableCheckpoint(sharded=False) writes one file, but {name} shards the state. Use sharded=True "
            "(the default for it), or save_distributed_checkpoint=False on the strategy to gather the full state "
            "on rank 0 (--trainer.strategy.save_distributed_checkpoint false)."
        )
    from_any_storage = isinstance(strategy, ModelParallelStrategy)  # not FSDPStrategy: Lightning's loader, local only
    if fitting and native and async_save and not from_any_storage:
        raise ConfigurationError(
            f"ResumableCheckpoint(async_save=True) writes the shards of strategy='model_parallel' (FSDP2) in the "
            f"background, not those of {name}: use model_parallel, or drop async_save."
        )
    if native and not from_any_storage and not CheckpointStore(dirpath).is_local:
        raise ConfigurationError(
            f"{name} loads sharded checkpoints from local disk only; dirpath={dirpath!r} is not local. Use a "
            "local (or mounted shared) directory, or strategy='model_parallel' (FSDP2), which loads from any URL."
        )
    if isinstance(strategy, ModelParallelStrategy):
        load_from_any_storage(strategy)
    if not native and not isinstance(strategy.checkpoint_io, ShardedAwareCheckpointIO):  # also to resume shards
        merge = not isinstance(strategy, DataParallelStrategy)  # which merges ZeRO-1 shares itself
        strategy.checkpoint_io = ShardedAwareCheckpointIO(strategy.checkpoint_io, merge_zero_shares=merge)
    return chosen


def local_cache(local_cache_dir: str | None, sharded: bool) -> CheckpointStore | None:
    """The local directory that absorbs each single-file save before its upload (``None``: none)."""
    if local_cache_dir is None:
        return None
    cache = CheckpointStore(local_cache_dir)
    if not cache.is_local:
        raise ConfigurationError(f"local_cache_dir={local_cache_dir!r} must be a local directory (fast disk).")
    if sharded:
        raise ConfigurationError(
            "ResumableCheckpoint(local_cache_dir=...) stages single files on rank 0's disk; sharded checkpoints "
            "are written by every rank: drop local_cache_dir, or save single files (sharded=False)."
        )
    return cache
