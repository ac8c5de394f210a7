"""Data helpers for exact resumption."""

from lightning_scale.data.worker_rng_dataset import WorkerRNGDataset

__all__ = ["WorkerRNGDataset"]
