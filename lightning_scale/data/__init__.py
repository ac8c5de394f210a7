"""Data helpers: exact resumption and preemptible DataLoader workers."""

from lightning_scale.data.job_signals import ShieldFromJobSignals, shield_workers
from lightning_scale.data.worker_rng_dataset import WorkerRNGDataset

__all__ = ["ShieldFromJobSignals", "WorkerRNGDataset", "shield_workers"]
