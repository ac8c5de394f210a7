"""WorkerRNGDataset makes augmentation inside StatefulDataLoader workers resume exactly."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_scale.data import WorkerRNGDataset


class Augmented(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return index + torch.rand(1)  # random augmentation from the worker's global RNG


def batches_after_resume(dataset: Dataset) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(dataset, batch_size=4, num_workers=2, generator=torch.Generator().manual_seed(0))

    first = loader()
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    expected = [next(iterator) for _ in range(4)]
    del iterator, first
    second = loader()
    second.load_state_dict(state)
    iterator = iter(second)
    return expected, [next(iterator) for _ in range(4)]


def test_worker_augmentation_resumes_exactly_when_wrapped():
    expected, resumed = batches_after_resume(WorkerRNGDataset(Augmented()))
    assert all(torch.equal(a, b) for a, b in zip(expected, resumed, strict=True))


def test_worker_augmentation_diverges_without_the_wrapper():
    expected, resumed = batches_after_resume(Augmented())
    assert not all(torch.equal(a, b) for a, b in zip(expected, resumed, strict=True))


def test_passes_indexing_and_length_through_and_is_empty_in_the_main_process():
    wrapped = WorkerRNGDataset([5, 6, 7])
    assert (wrapped[2], len(wrapped), wrapped.state_dict()) == (7, 3, {})
    wrapped.load_state_dict({})


class Batched(Dataset):
    def __init__(self) -> None:
        self.level = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        raise NotImplementedError("only batched reads")

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [index * 10 + self.level for index in indices]


def test_the_wrapper_keeps_batched_reads_and_forwards_attribute_writes():
    wrapped = WorkerRNGDataset(Batched())
    loader = StatefulDataLoader(wrapped, batch_size=4)
    wrapped.level = 3  # as a curriculum callback sets it through trainer.train_dataloader.dataset
    assert wrapped.dataset.level == 3
    assert [batch.tolist() for batch in loader] == [[3, 13, 23, 33], [43, 53, 63, 73]]
    assert WorkerRNGDataset([1, 2]).__getitems__ is None
