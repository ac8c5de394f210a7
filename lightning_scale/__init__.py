"""lightning-scale: plugins for PyTorch Lightning that make training at scale safe and cheap."""

from lightning_scale.callbacks import DataStateCheckpoint, ResumableCheckpoint, SpotPreemption
from lightning_scale.data import WorkerRNGDataset

__version__ = "0.1.0"

__all__ = ["DataStateCheckpoint", "ResumableCheckpoint", "SpotPreemption", "WorkerRNGDataset", "__version__"]
