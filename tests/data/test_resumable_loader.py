"""make_resumable: loaders as users write them become loaders that resume exactly, or say why they cannot."""

from __future__ import annotations

import gc
import random
import sys

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, Sampler, WeightedRandomSampler
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

from lightning_scale._lightning_internals import sampler_in_lightning_wrapper
from lightning_scale.data import WorkerRNGDataset, WorkerRNGIterableDataset
from lightning_scale.data.resumable_loader import EpochSeededSampler, make_resumable, run_seed
from tests.data.user_code import NoisyDataset, OwnOrder


def rebuilt(loader, world_size: int = 1, seed: int = 0):
    return make_resumable(loader, seed=seed, world_size=world_size, inner_sampler=sampler_in_lightning_wrapper)


def ids(batches) -> list[list[int]]:
    return [batch["sample_id"].tolist() for batch in batches]


def user_collate(items):
    return torch.utils.data.default_collate(items)


def user_worker_init(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)  # the usual recipe for NumPy in workers


def test_torch_dataloader_becomes_a_statefuldataloader_with_the_same_arguments():
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        NoisyDataset(),
        batch_size=5,
        shuffle=True,
        num_workers=2,
        collate_fn=user_collate,
        drop_last=True,
        worker_init_fn=user_worker_init,
        generator=generator,
        persistent_workers=True,
        prefetch_factor=3,
        timeout=30,
    )
    result = rebuilt(loader)
    new = result.loader
    assert type(new) is StatefulDataLoader and result.problems == []
    assert (new.batch_size, new.drop_last, new.num_workers, new.prefetch_factor, new.timeout) == (5, True, 2, 3, 30)
    assert new.collate_fn is user_collate and new.worker_init_fn is user_worker_init and new.generator is generator
    assert new.persistent_workers and new.multiprocessing_context is None  # one process: fork stays
    assert isinstance(new.sampler, EpochSeededSampler) and isinstance(new.dataset, WorkerRNGDataset)
    assert new.dataset.x is loader.dataset.x  # the user's dataset attributes stay reachable


def test_batch_size_none_and_a_custom_batch_sampler_are_kept():
    dataset = NoisyDataset(8)
    unbatched = rebuilt(DataLoader(dataset, batch_size=None, shuffle=True)).loader
    assert unbatched.batch_size is None and isinstance(unbatched.sampler, EpochSeededSampler)
    assert sorted(item["sample_id"] for item in unbatched) == list(range(8))
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    custom = rebuilt(DataLoader(dataset, batch_sampler=pairs))
    assert custom.loader.batch_sampler is pairs and ids(custom.loader) == pairs and custom.problems == []


@pytest.mark.parametrize(
    "make_sampler", [RandomSampler, StatefulRandomSampler, lambda d: WeightedRandomSampler([1.0] * len(d), len(d))]
)
def test_each_epochs_order_depends_only_on_seed_and_epoch(make_sampler):
    def epoch_order(epoch: int, global_seed: int) -> list[list[int]]:
        torch.manual_seed(global_seed)  # whatever ran before the resume drew from the global RNG differently
        dataset = NoisyDataset(24)
        loader = rebuilt(StatefulDataLoader(dataset, batch_size=4, sampler=make_sampler(dataset)), seed=7).loader
        loader.sampler.set_epoch(epoch)
        return ids(loader)

    assert epoch_order(1, global_seed=0) == epoch_order(1, global_seed=123)
    assert epoch_order(1, global_seed=0) != epoch_order(2, global_seed=0)


def test_the_sampler_inside_lightnings_distributed_wrapper_is_epoch_seeded():
    dataset = NoisyDataset(24)
    wrapper = DistributedSamplerWrapper(StatefulRandomSampler(dataset), num_replicas=2, rank=1, seed=4)
    new = rebuilt(StatefulDataLoader(dataset, batch_size=2, sampler=wrapper), world_size=2).loader.sampler
    assert type(new) is DistributedSamplerWrapper and (new.num_replicas, new.rank, new.seed) == (2, 1, 4)
    assert isinstance(sampler_in_lightning_wrapper(new), EpochSeededSampler)
    new.set_epoch(3)
    assert sampler_in_lightning_wrapper(new).epoch == 3  # the wrapper forwards the epoch


def _set_epoch(loader, epoch: int) -> None:
    if callable(getattr(loader.sampler, "set_epoch", None)):  # an iterable dataset's loader has no epoch order
        loader.sampler.set_epoch(epoch)


def positions_after_resume(loader_factory, consumed: int = 3, compared: int = 5):
    """Batches after ``consumed`` of an epoch, uninterrupted and from a new loader that loaded the state there."""
    first = loader_factory()
    _set_epoch(first, 1)
    iterator = iter(first)
    for _ in range(consumed):
        next(iterator)
    state = first.state_dict()
    expected = [next(iterator) for _ in range(compared)]
    del iterator, first
    torch.manual_seed(99), np.random.seed(99), random.seed(99)  # the resumed process's RNGs start elsewhere
    second = loader_factory()
    _set_epoch(second, 1)
    second.load_state_dict(state)
    iterator = iter(second)
    return expected, [next(iterator) for _ in range(compared)]


@pytest.mark.parametrize(("workers", "consumed"), [(0, 3), (2, 3), (2, 11)])
def test_a_shuffled_torch_dataloader_with_augmentation_in_workers_resumes_mid_epoch_exactly(workers, consumed):
    def factory():
        loader = DataLoader(
            NoisyDataset(), batch_size=4, shuffle=True, num_workers=workers, worker_init_fn=user_worker_init
        )
        return rebuilt(loader, seed=11).loader

    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    expected, resumed = positions_after_resume(factory, consumed)  # between snapshots (every 8 batches) and after one
    assert ids(expected) == ids(resumed)
    if workers:  # the main process's RNG is DataStateCheckpoint's business; workers' states travel in the loader
        assert all(torch.equal(a["x"], b["x"]) for a, b in zip(expected, resumed, strict=True))


class Stream(IterableDataset):
    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        return iter(range(self.position, 40))

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class PlainStream(IterableDataset):
    def __iter__(self):
        return iter(range(40))


class MyLoader(DataLoader):
    pass


class ShardedStream(IterableDataset):
    """An iterable dataset with its own state, sharded over workers, with augmentation from the worker's RNG."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        while self.position < 80:
            index, self.position = self.position, self.position + 1
            if index % workers == worker:
                yield {"sample_id": index, "x": torch.rand(2) + random.random()}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


@pytest.mark.parametrize("consumed", [3, 9])
def test_a_stateful_iterable_dataset_with_augmentation_in_workers_resumes_mid_epoch_exactly(consumed):
    def factory():
        return rebuilt(DataLoader(ShardedStream(), batch_size=4, num_workers=2), seed=3).loader

    expected, resumed = positions_after_resume(factory, consumed)
    assert ids(expected) == ids(resumed)
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(expected, resumed, strict=True))


def test_an_iterable_dataset_with_state_gets_its_workers_rng_carried_beside_its_own_state():
    new = rebuilt(DataLoader(Stream(), batch_size=4, num_workers=2)).loader
    assert isinstance(new.dataset, WorkerRNGIterableDataset)
    assert new.dataset.state_dict() == {"dataset": {"position": 0}}


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        (DataLoader(PlainStream(), batch_size=4), r"IterableDataset PlainStream, which has no state_dict\(\).*Give it"),
        (DataLoader(list(range(8)), sampler=OwnOrder(8)), r"OwnOrder, which has no state_dict\(\) and no set_epoch"),
        (MyLoader(list(range(8))), r"MyLoader, a DataLoader subclass.*StatefulDataLoader instead"),
        ((b for b in range(3)), r"is a generator, not a DataLoader.*state_dict"),
    ],
    ids=["iterable-without-state", "sampler-without-state", "dataloader-subclass", "generator"],
)
def test_what_cannot_resume_exactly_is_named_with_its_fix(loader, message):
    result = rebuilt(loader)
    assert len(result.problems) == 1
    assert __import__("re").search(message, result.problems[0]), result.problems[0]


def test_a_user_sampler_with_state_or_set_epoch_is_trusted_and_kept():
    dataset = list(range(16))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=3)
    result = rebuilt(DataLoader(dataset, sampler=sampler, batch_size=2))
    assert result.problems == [] and result.loader.sampler is sampler


def test_distributed_workers_start_from_a_forkserver_unless_the_user_chose_a_context():
    automatic = rebuilt(DataLoader(NoisyDataset(), num_workers=2), world_size=2).loader
    assert automatic.multiprocessing_context.get_start_method() == "forkserver"
    chosen = rebuilt(DataLoader(NoisyDataset(), num_workers=2, multiprocessing_context="spawn"), world_size=2).loader
    assert chosen.multiprocessing_context.get_start_method() == "spawn"
    assert rebuilt(DataLoader(NoisyDataset(), num_workers=0), world_size=2).loader.multiprocessing_context is None


class Lambdas(Dataset):
    def __init__(self) -> None:
        self.transform = lambda x: x  # fine with fork, not picklable

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return self.transform(index)


def test_what_a_forkserver_cannot_take_keeps_fork_with_a_warning_naming_it():
    with pytest.warns(UserWarning, match=r"start with fork.*cannot be pickled.*lambda"):
        loader = rebuilt(DataLoader(Lambdas(), num_workers=2), world_size=2).loader
    assert loader.multiprocessing_context is None
    assert list(loader) == [torch.tensor([0]), torch.tensor([1]), torch.tensor([2]), torch.tensor([3])]


def test_the_users_seed_is_the_loaders_generator_then_seed_everythings():
    dataset = list(range(8))
    assert run_seed(DataLoader(dataset, generator=torch.Generator().manual_seed(5)), global_seed=1) == 5
    assert (
        run_seed(DataLoader(dataset, sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(6))), 1)
        == 6
    )
    assert (
        run_seed(StatefulDataLoader(dataset, shuffle=True), global_seed=1) == 1
    )  # torchdata's own generator: not the user's
    assert run_seed(DataLoader(dataset, shuffle=True), global_seed=None) is None  # the run draws and keeps one


def test_forkserver_workers_really_start_and_deliver():
    loader = rebuilt(DataLoader(NoisyDataset(16), batch_size=4, num_workers=2), world_size=2).loader
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    assert sorted(i for batch in ids(loader) for i in batch) == list(range(16))


class FreezeCount(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return gc.get_freeze_count()


def test_forkserver_workers_start_with_the_preloaded_modules_frozen_out_of_the_collector():
    loader = rebuilt(DataLoader(FreezeCount(), batch_size=2, num_workers=2), world_size=2).loader
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    counts = [int(count) for batch in loader for count in batch]
    assert len(counts) == 4 and min(counts) > 100_000  # torch, Lightning and ours: never copied, never collected


class DefinedInTheScript(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


DefinedInTheScript.__module__ = "__main__"

SCRIPTS = {  # a script being run, and why its workers must keep fork (None: a forkserver is fine)
    "guarded": ('import torch\nclass DefinedInTheScript: pass\nif __name__ == "__main__":\n    main()\n', None),
    "runs-at-import": ("import torch\nclass DefinedInTheScript: pass\nmain()\n", r"runs code at import \(line 3\)"),
    "defined-under-the-guard": (
        'import sys\nsys.path.insert(0, ".")\nif __name__ == "__main__":\n    class DefinedInTheScript: pass\n',
        r"DefinedInTheScript is defined inside `if __name__ == \"__main__\":`",
    ),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_workers_take_a_forkserver_only_when_importing_the_running_script_is_harmless(script, tmp_path, monkeypatch):
    import types

    source, problem = SCRIPTS[script]
    path = tmp_path / "train.py"
    path.write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    main.DefinedInTheScript = DefinedInTheScript  # as running the script defined it
    monkeypatch.setitem(sys.modules, "__main__", main)
    loader = DataLoader(DefinedInTheScript(), num_workers=2)
    if problem is None:
        assert rebuilt(loader, world_size=2).loader.multiprocessing_context.get_start_method() == "forkserver"
        return
    with pytest.warns(UserWarning, match=r"start with fork.*" + problem):
        assert rebuilt(loader, world_size=2).loader.multiprocessing_context is None


def test_a_class_of_an_interactive_session_keeps_fork(monkeypatch):
    import types

    main = types.ModuleType("__main__")  # python -c, a notebook: no file
    main.DefinedInTheScript = DefinedInTheScript
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.warns(UserWarning, match=r"DefinedInTheScript is defined in an interactive session"):
        loader = rebuilt(DataLoader(DefinedInTheScript(), num_workers=2), world_size=2).loader
    assert loader.multiprocessing_context is None


class InMemory(Dataset):
    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return self.data[index]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (torch.zeros(17 * 2**20), r"hold 68 MiB of tensors and arrays"),
        (np.zeros(17 * 2**20, dtype=np.float32), r"hold 68 MiB of tensors and arrays"),
    ],
    ids=["large-tensor", "large-array"],
)
def test_large_in_memory_data_keeps_fork_where_workers_share_it(data, why):
    with pytest.warns(UserWarning, match=why):
        assert rebuilt(DataLoader(InMemory(data), num_workers=2), world_size=2).loader.multiprocessing_context is None


def test_a_numpy_memmap_keeps_fork(tmp_path):
    data = np.memmap(tmp_path / "data.bin", dtype=np.float32, mode="w+", shape=(16,))
    with pytest.warns(UserWarning, match=r"NumPy memmap"):
        assert rebuilt(DataLoader(InMemory(data), num_workers=2), world_size=2).loader.multiprocessing_context is None


class NumpyOrder(Sampler[int]):
    """A user's sampler drawing from a NumPy generator: not one make_resumable knows how to seed."""

    def __init__(self, n: int) -> None:
        self.n, self.generator, self.epochs = n, np.random.default_rng(0), []

    def __iter__(self):
        return iter(self.generator.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class NumpyOrderWithEpochs(NumpyOrder):
    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self.generator = np.random.default_rng(epoch)


def test_a_users_sampler_with_a_generator_of_its_own_is_never_rewired():
    plain = rebuilt(DataLoader(list(range(8)), sampler=NumpyOrder(8), batch_size=2))
    assert type(plain.loader.sampler) is NumpyOrder and len(list(plain.loader)) == 4
    assert "NumpyOrder, which has no state_dict() and no set_epoch()" in plain.problems[0]
    with_epochs = rebuilt(DataLoader(list(range(8)), sampler=NumpyOrderWithEpochs(8), batch_size=2))
    assert type(with_epochs.loader.sampler) is NumpyOrderWithEpochs and with_epochs.problems == []
