"""A dataset wrapper that makes DataLoader worker processes checkpoint their random number generators."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from torch.utils.data import Dataset, get_worker_info

from lightning_scale.rng import capture_rng_state, restore_rng_state

__all__ = ["WorkerRNGDataset"]

T_co = TypeVar("T_co", covariant=True)


class WorkerRNGDataset(Dataset[T_co], Generic[T_co]):
    """Wrap a map-style dataset so that random augmentation in worker processes resumes exactly.

    torchdata's ``StatefulDataLoader`` saves its workers' positions but not their RNG states, so augmentation drawn
    in ``__getitem__`` with ``num_workers > 0`` differs after a resume. ``StatefulDataLoader`` does snapshot a
    dataset's own ``state_dict`` inside each worker after every batch; this wrapper uses that to carry the worker's
    Python, NumPy and torch RNG states through the checkpoint. In the main process (``num_workers=0``) it holds no
    state: :class:`~lightning_scale.callbacks.DataStateCheckpoint` restores the main process's RNG itself.

    Args:
        dataset: The map-style dataset to wrap; indexing and ``len`` pass through.

    Example:
        >>> wrapped = WorkerRNGDataset([10, 20, 30])
        >>> wrapped[1], len(wrapped), wrapped.state_dict()
        (20, 3, {})
    """

    def __init__(self, dataset: Dataset[T_co]) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> T_co:
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """The RNG state of the worker process this runs in; empty in the main process."""
        if get_worker_info() is None:
            return {}
        return {"rng": capture_rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the worker's RNG state saved by :meth:`state_dict` (no-op for an empty state)."""
        if "rng" in state_dict:
            restore_rng_state(state_dict["rng"])
