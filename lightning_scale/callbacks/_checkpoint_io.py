"""How the Trainer reads and writes checkpoints as ``ResumableCheckpoint`` uses it: a user's ``CheckpointIO`` plugin
writes each single-file checkpoint, sharded directories load on strategies whose own loader reads single files only,
and ``ModelParallelStrategy`` loads from any fsspec URL (Lightning's loader takes local paths)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from lightning.pytorch.utilities import rank_zero_warn

from lightning_scale._lightning_internals import load_checkpoints_with
from lightning_scale.checkpoint.damaged import named_if_unreadable
from lightning_scale.checkpoint.sharded import is_sharded_checkpoint, load_into_sharded_model, load_sharded
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.data.zero_state import whole_state_dict

__all__ = ["ShardedAwareCheckpointIO", "load_from_any_storage", "plugin_save_file"]


class ShardedAwareCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that loads sharded directories with :func:`load_sharded` and delegates everything
    else to the ``CheckpointIO`` it wraps; set on DDP-like strategies, whose own loader reads single files only.

    ``merge_zero_shares``: merge the per-rank shares of a ZeRO-1 optimizer state into one state dict, for strategies
    that do not (``data_parallel`` takes only its own share when it can). A checkpoint given to :meth:`preload` (a
    memory snapshot) is what the next load of its path returns, once."""

    def __init__(self, inner: CheckpointIO, merge_zero_shares: bool) -> None:
        self.inner = inner
        self.merge_zero_shares = merge_zero_shares
        self._preloaded: dict[str, dict[str, Any]] = {}

    def preload(self, path: str, checkpoint: dict[str, Any]) -> None:
        """Have the next :meth:`load_checkpoint` of ``path`` return ``checkpoint``."""
        self._preloaded[path] = checkpoint

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if str(path) in self._preloaded:
            return self._preloaded.pop(str(path))
        if is_sharded_checkpoint(str(path)):
            checkpoint = load_sharded(str(path), weights_only=weights_only)
            if self.merge_zero_shares:
                checkpoint["optimizer_states"] = [whole_state_dict(s) for s in checkpoint.get("optimizer_states", [])]
            return checkpoint
        with named_if_unreadable(str(path)):
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


def load_from_any_storage(strategy: ModelParallelStrategy) -> None:
    """Make ``strategy.load_checkpoint`` read checkpoints from any fsspec URL as well as local paths.

    A sharded directory loads on every rank straight into the sharded model, each rank reading the parts of the
    files its shards need (:func:`load_into_sharded_model`; any world size). A single file (written with
    ``save_distributed_checkpoint=False``) on an object store is copied to a local temporary file for Lightning's
    loader, which reads the full state on every rank anyway. Idempotent.
    """

    def load(lightning_load: Callable[[str, bool | None], dict[str, Any]], path: str, weights_only: bool | None) -> Any:
        path = str(strategy.broadcast(path))
        if is_sharded_checkpoint(path):
            module, model = strategy.lightning_module, strategy.model
            assert model is not None and module is not None
            return load_into_sharded_model(path, model, strategy.optimizers, module.strict_loading, weights_only)
        store = CheckpointStore(path)
        if store.is_local:
            return lightning_load(path, weights_only)
        with tempfile.TemporaryDirectory(prefix="lightning-scale-load-") as local:
            copy = os.path.join(local, "checkpoint.ckpt")
            store.fs.get(store.root, copy)
            return lightning_load(copy, weights_only)

    load_checkpoints_with(strategy, load)
