"""Dataset wrappers that make DataLoader worker processes checkpoint their random number generators."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from lightning_scale.rng import capture_rng_state, restore_rng_state

__all__ = ["WorkerRNGDataset", "WorkerRNGIterableDataset"]

T_co = TypeVar("T_co", covariant=True)


class _WorkerRNGState:
    """The state both wrappers give torchdata: the worker's RNG states and the wrapped dataset's own state."""

    dataset: Any

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):  # not set yet while unpickling in a worker
            raise AttributeError(name)
        return getattr(self.dataset, name)  # the user's dataset attributes stay reachable through the loader

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "dataset":
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)  # e.g. a curriculum level set through trainer.train_dataloader

    @property
    def __getitems__(self) -> Any:
        """The wrapped dataset's batched fetch, which torch's fetcher uses when it is there (``None`` otherwise)."""
        return getattr(self.dataset, "__getitems__", None)

    def state_dict(self) -> dict[str, Any]:
        """The RNG state of the worker process this runs in (none in the main process) and the dataset's state."""
        state: dict[str, Any] = {}
        if get_worker_info() is not None:
            state["rng"] = capture_rng_state()
        if callable(getattr(self.dataset, "state_dict", None)):
            state["dataset"] = self.dataset.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (an empty state changes nothing)."""
        if "dataset" in state_dict:
            self.dataset.load_state_dict(state_dict["dataset"])
        if "rng" in state_dict:
            restore_rng_state(state_dict["rng"])


class WorkerRNGDataset(_WorkerRNGState, Dataset[T_co], Generic[T_co]):
    """Wrap a map-style dataset so that random augmentation in worker processes resumes exactly.

    torchdata's ``StatefulDataLoader`` saves its workers' positions but not their RNG states, so augmentation drawn
    in ``__getitem__`` with ``num_workers > 0`` would differ after a resume. ``StatefulDataLoader`` snapshots a
    dataset's own ``state_dict`` inside each worker after every batch; this wrapper uses that to carry the worker's
    Python, NumPy and torch RNG states through the checkpoint, beside the wrapped dataset's own state when it has
    one. In the main process (``num_workers=0``) it holds no RNG state:
    :class:`~lightning_scale.callbacks.DataStateCheckpoint` restores the main process's RNG itself.
    ``DataStateCheckpoint`` wraps the training dataset of every loader with workers by itself; wrap it yourself
    only where you build loaders outside a Trainer. Attributes of the wrapped dataset are reachable through it.

    Args:
        dataset: The map-style dataset to wrap; indexing and ``len`` pass through.

    Examples:
        >>> wrapped = WorkerRNGDataset([10, 20, 30])
        >>> wrapped[1], len(wrapped), wrapped.state_dict()
        (20, 3, {})
    """

    def __init__(self, dataset: Dataset[T_co]) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> T_co:
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)


class WorkerRNGIterableDataset(_WorkerRNGState, IterableDataset[T_co], Generic[T_co]):
    """:class:`WorkerRNGDataset` for an ``IterableDataset`` that has ``state_dict``/``load_state_dict`` of its own.

    Args:
        dataset: The iterable dataset to wrap; iteration and ``len`` (when it has one) pass through.

    Examples:
        >>> class Counting(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(3))
        ...     def state_dict(self):
        ...         return {"position": 0}
        ...     def load_state_dict(self, state):
        ...         pass
        >>> wrapped = WorkerRNGIterableDataset(Counting())
        >>> list(wrapped), wrapped.state_dict()
        ([0, 1, 2], {'dataset': {'position': 0}})
    """

    def __init__(self, dataset: IterableDataset[T_co]) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[T_co]:
        return iter(self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)  # a TypeError when it has none, as for the dataset
