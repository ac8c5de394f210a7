"""Lightning callbacks of lightning-scale."""

from lightning_scale.callbacks.data_state import DataStateCheckpoint
from lightning_scale.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_scale.callbacks.spot_preemption import SpotPreemption

__all__ = ["DataStateCheckpoint", "ResumableCheckpoint", "SpotPreemption"]
