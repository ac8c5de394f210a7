"""Lightning loading sharded checkpoint directories on strategies whose own loader reads single files."""

from __future__ import annotations

from typing import Any

from lightning.fabric.plugins.io import CheckpointIO
from lightning.fabric.utilities.types import _PATH

from lightning_scale.checkpoint.sharded import is_sharded_checkpoint, load_sharded

__all__ = ["ShardedAwareCheckpointIO"]


class ShardedAwareCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` that loads sharded directories with :func:`load_sharded` and delegates everything
    else to the ``CheckpointIO`` it wraps; set on DDP-like strategies, whose own loader reads single files only."""

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if is_sharded_checkpoint(str(path)):
            return load_sharded(str(path), weights_only=weights_only)
        return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: _PATH) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()
