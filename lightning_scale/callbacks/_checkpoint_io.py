"""The Trainer's ``CheckpointIO`` as ``ResumableCheckpoint`` uses it: a user's plugin writes each single-file
checkpoint, and sharded directories load on strategies whose own loader reads single files only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_warn

from lightning_scale.checkpoint.sharded import is_sharded_checkpoint, load_sharded
from lightning_scale.errors import ConfigurationError

__all__ = ["ShardedAwareCheckpointIO", "plugin_save_file"]


class ShardedAwareCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that loads sharded directories with :func:`load_sharded` and delegates everything
    else to the ``CheckpointIO`` it wraps; set on DDP-like strategies, whose own loader reads single files only."""

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if is_sharded_checkpoint(str(path)):
            return load_sharded(str(path), weights_only=weights_only)
        return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: str | Path) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def plugin_save_file(strategy: Strategy, sharded: bool) -> Callable[[dict[str, Any], str], None] | None:
    """How a user's ``CheckpointIO`` plugin writes a checkpoint file (``save_file(checkpoint, url)``), or ``None``
    when the strategy has Lightning's default, which ``torch.save`` streamed to storage matches byte for byte.
    ``sharded`` checkpoints are written by ``torch.distributed.checkpoint``, not by the plugin: that is warned about."""
    plugin = strategy.checkpoint_io
    if isinstance(plugin, ShardedAwareCheckpointIO):
        plugin = plugin.inner
    if type(plugin) is TorchCheckpointIO:
        return None
    if isinstance(plugin, AsyncCheckpointIO):
        raise ConfigurationError(
            "ResumableCheckpoint publishes a checkpoint only once its file is complete, and AsyncCheckpointIO returns "
            "before that. Drop the AsyncCheckpointIO plugin and use ResumableCheckpoint(async_save=True): its saves "
            "are asynchronous too, and atomic."
        )
    if sharded:
        rank_zero_warn(
            "ResumableCheckpoint writes sharded checkpoints with torch.distributed.checkpoint, so the Trainer's "
            "CheckpointIO plugin does not write them. Pass sharded=False to have it write single files "
            "(strategies that shard the state need save_distributed_checkpoint=False too)."
        )
    return lambda checkpoint, url: plugin.save_checkpoint(checkpoint, url)
