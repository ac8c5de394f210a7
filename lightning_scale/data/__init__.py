"""Data helpers: exact resumption of the loaders users write, and DataLoader workers that start and stop safely."""

from lightning_scale.data.forkserver import safe_worker_context
from lightning_scale.data.job_signals import ShieldFromJobSignals, shield_workers
from lightning_scale.data.resumable_loader import EpochSeededSampler, ResumableLoader, make_resumable
from lightning_scale.data.worker_rng_dataset import WorkerRNGDataset, WorkerRNGIterableDataset
from lightning_scale.data.worker_start import STUCK_WORKERS_EXIT_CODE, WorkerStartWatchdog

__all__ = [
    "STUCK_WORKERS_EXIT_CODE",
    "EpochSeededSampler",
    "ResumableLoader",
    "ShieldFromJobSignals",
    "WorkerRNGDataset",
    "WorkerRNGIterableDataset",
    "WorkerStartWatchdog",
    "make_resumable",
    "safe_worker_context",
    "shield_workers",
]
