"""Checkpoint storage and manifests: plain logic over fsspec, no Lightning imports."""

from lightning_scale.checkpoint.cadence import AutoCadence, young_daly_interval_seconds
from lightning_scale.checkpoint.consolidate import consolidate_checkpoint
from lightning_scale.checkpoint.manifest import Manifest, find_newest_valid, publish_checkpoint, validate
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore, UnusableStorageError

__all__ = [
    "AutoCadence",
    "CheckpointStorageError",
    "CheckpointStore",
    "Manifest",
    "UnusableStorageError",
    "consolidate_checkpoint",
    "find_newest_valid",
    "publish_checkpoint",
    "validate",
    "young_daly_interval_seconds",
]
