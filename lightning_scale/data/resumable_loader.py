"""Turn the training loaders users write into ones that resume exactly: pure torch/torchdata logic, no Lightning.

:func:`make_resumable` is what :class:`~lightning_scale.callbacks.DataStateCheckpoint` applies to every training
loader of a fit. It rebuilds torch's ``DataLoader`` (and ``StatefulDataLoader``) as a ``StatefulDataLoader`` with
the same arguments, draws every epoch's shuffled order from (seed, epoch) alone, checkpoints the workers' RNG, and
names what it cannot make exact.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import BatchSampler as StatefulBatchSampler
from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

from lightning_scale.data.forkserver import worker_context
from lightning_scale.data.worker_rng_dataset import WorkerRNGDataset, WorkerRNGIterableDataset

__all__ = ["EpochSeededSampler", "ResumableLoader", "make_resumable"]

log = logging.getLogger(__name__)

_REBUILT_TYPES = (DataLoader, StatefulDataLoader)  # exact types only: a subclass may take other arguments
_PLAIN_BATCH_SAMPLERS = (BatchSampler, StatefulBatchSampler)  # what DataLoader(batch_size=...) builds
_GENERATOR_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler, StatefulRandomSampler)
SNAPSHOT_EVERY_N_STEPS = 8
"""How often a rebuilt torch ``DataLoader``'s workers send their state (RNG included) to the training process. A
checkpoint between two snapshots resumes from the previous one and reads the batches since again (up to 7, exactly
as the first time); snapshotting every batch cost about 5 % of data-loading throughput (benchmarks/data_loading.py)."""
_SEED_MIX = 0x9E3779B97F4A7C15  # keeps (seed, epoch) streams apart from DistributedSampler's seed + epoch


class EpochSeededSampler(Sampler[int]):
    """A random sampler whose order in each epoch depends only on (``seed``, epoch).

    ``RandomSampler`` without a generator draws its order from the global RNG when its iterator starts, so the order
    of a resumed epoch depends on what ran before the resume. This wrapper gives the wrapped sampler a generator
    seeded from (``seed``, epoch) each time an epoch starts; Lightning (and ``DistributedSamplerWrapper``) call
    :meth:`set_epoch` before every epoch. Every other property of the wrapped sampler (weights, subset,
    replacement) is kept.

    Args:
        sampler: A sampler that draws from its ``generator`` attribute (torch's ``RandomSampler``,
            ``SubsetRandomSampler``, ``WeightedRandomSampler``, torchdata's ``RandomSampler``).
        seed: The run's seed.

    Examples:
        >>> from torch.utils.data import RandomSampler
        >>> sampler = EpochSeededSampler(RandomSampler(range(6)), seed=7)
        >>> first = list(sampler)
        >>> first == list(sampler), sorted(first)
        (True, [0, 1, 2, 3, 4, 5])
    """

    def __init__(self, sampler: Sampler[int], seed: int) -> None:
        self.sampler = sampler
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iterator draws."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed((self.seed * _SEED_MIX + self.epoch) % 2**63)
        self.sampler.generator = generator  # type: ignore[attr-defined]
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


@dataclasses.dataclass
class ResumableLoader:
    """What :func:`make_resumable` made of one loader.

    Attributes:
        loader: The loader to train with (the one given when nothing had to change).
        problems: What still keeps this loader from resuming exactly, each with its fix; empty when it will.
    """

    loader: Any
    problems: list[str]


def make_resumable(
    loader: Any,
    *,
    seed: int,
    world_size: int,
    rank: int = 0,
    name: str = "training dataloader",
    inner_sampler: Callable[[Any], Any] = lambda sampler: None,
    wrap_sampler: Callable[[Any], Any] | None = None,
    replace_sampler: Callable[[Any], Any] | None = None,
) -> ResumableLoader:
    """Make ``loader`` resume exactly mid-epoch, or say what keeps it from doing so.

    - torch's ``DataLoader`` and torchdata's ``StatefulDataLoader`` (exact types) are rebuilt as a
      ``StatefulDataLoader`` with the same arguments, so that their position is saved;
    - a random sampler (``shuffle=True``, ``RandomSampler`` and others drawing from a generator, also inside
      Lightning's ``DistributedSamplerWrapper``) gets an :class:`EpochSeededSampler`;
    - a loader without a ``generator`` gets one seeded from (``seed``, ``rank``): each epoch's worker seeds are then
      drawn from it (and checkpointed with it) instead of from the global RNG, which validation and user code also
      draw from;
    - with workers, the dataset is wrapped in :class:`WorkerRNGDataset` (or :class:`WorkerRNGIterableDataset`) so
      the workers' RNG states are checkpointed;
    - with workers in a distributed run and no ``multiprocessing_context`` chosen, workers start from a forkserver
      (see :func:`~lightning_scale.data.forkserver.worker_context`).

    Args:
        loader: A training loader as Lightning prepared it (distributed sampler already injected).
        seed: The seed for shuffled orders: the user's (see :func:`run_seed`), or one the run keeps.
        world_size: Processes in the run.
        rank: This process's rank (mixed into the seed of the workers' RNG when the loader has no generator).
        name: How to call the loader in messages.
        inner_sampler: Returns the sampler wrapped inside a distributed sampler (Lightning's
            ``DistributedSamplerWrapper``), ``None`` for any other.
        wrap_sampler: Called with the (seeded) sampler of a rebuilt loader that has a batch size; the loader draws
            from what it returns instead (an elastic resume's rest of an epoch). Not called for other loaders.
        replace_sampler: Called with ``loader`` when it is rebuilt over a sampler (not a batch sampler of its own);
            a sampler it returns takes the place of the loader's before seeding (the distributed sampler DDP would
            inject, on a process that has none), ``None`` keeps the loader's.
    """
    problems = _problems(loader, name, inner_sampler)
    if type(loader) not in _REBUILT_TYPES:
        return ResumableLoader(loader, problems)
    dataset = _dataset_with_worker_rng(loader.dataset, loader.num_workers)
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": worker_context(loader, name, world_size),
        "generator": loader.generator if loader.generator is not None else _worker_seed_generator(seed, rank),
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
        "in_order": loader.in_order,
        "snapshot_every_n_steps": getattr(loader, "snapshot_every_n_steps", SNAPSHOT_EVERY_N_STEPS),
    }
    batch_sampler = loader.batch_sampler
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif batch_sampler is None:  # batch_size=None: no automatic batching
        own = _replaced(loader.sampler, loader, replace_sampler)
        kwargs.update(sampler=_seeded(own, seed, inner_sampler), batch_size=None)
    elif loader.batch_size is not None or type(batch_sampler) in _PLAIN_BATCH_SAMPLERS:
        sampler = _seeded(_replaced(batch_sampler.sampler, loader, replace_sampler), seed, inner_sampler)
        kwargs.update(
            sampler=sampler if wrap_sampler is None else wrap_sampler(sampler),
            batch_size=batch_sampler.batch_size,
            drop_last=batch_sampler.drop_last,
        )
    else:
        kwargs.update(batch_sampler=loader.batch_sampler)  # a custom one: kept as given
    rebuilt = StatefulDataLoader(dataset, **kwargs)
    log.debug("%s rebuilt as a StatefulDataLoader (sampler %s)", name, type(rebuilt.sampler).__name__)
    return ResumableLoader(rebuilt, problems)


def _replaced(sampler: Any, loader: Any, replace_sampler: Callable[[Any], Any] | None) -> Any:
    """``sampler`` (the one ``loader`` draws indices from), or what ``replace_sampler`` puts in its place."""
    replacement = None if replace_sampler is None else replace_sampler(loader)
    return sampler if replacement is None else replacement


def _worker_seed_generator(seed: int, rank: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed((seed * _SEED_MIX + 0x5EED + rank * 0x9E37) % 2**63)
    return generator


def run_seed(loader: Any, global_seed: int | None) -> int | None:
    """The seed the user gave for a loader's shuffled orders: its own ``generator``'s, else ``seed_everything``'s
    (``global_seed``); ``None`` when they gave none."""
    generator = getattr(loader, "generator", None)
    if isinstance(generator, torch.Generator):
        return generator.initial_seed()
    sampler = getattr(loader, "sampler", None)
    own = getattr(sampler, "generator", None)  # torch's samplers keep None unless the user gave one
    if isinstance(own, torch.Generator) and not isinstance(sampler, StatefulRandomSampler):
        return own.initial_seed()  # torchdata's RandomSampler makes its own from the global RNG: not the user's
    return global_seed


def _seeded(sampler: Any, seed: int, inner_sampler: Callable[[Any], Any]) -> Any:
    """``sampler`` with every random sampler in it (also one inside Lightning's wrapper) epoch-seeded."""
    if _draws_from_generator(sampler):
        return EpochSeededSampler(sampler, seed)
    inner = inner_sampler(sampler)
    if inner is not None and _draws_from_generator(inner):
        return type(sampler)(
            EpochSeededSampler(inner, seed),
            num_replicas=sampler.num_replicas,
            rank=sampler.rank,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
            drop_last=sampler.drop_last,
        )
    return sampler


def _draws_from_generator(sampler: Any) -> bool:
    """Whether ``sampler`` is one of torch's or torchdata's random samplers, drawing from a ``torch.Generator`` (or
    the global RNG) and with no epoch handling of its own: those get an :class:`EpochSeededSampler`."""
    return (
        isinstance(sampler, _GENERATOR_SAMPLERS)
        and (sampler.generator is None or isinstance(sampler.generator, torch.Generator))
        and not callable(getattr(sampler, "set_epoch", None))
        and not _is_stateful(sampler)
    )


def _dataset_with_worker_rng(dataset: Any, num_workers: int) -> Any:
    if num_workers == 0 or isinstance(dataset, (WorkerRNGDataset, WorkerRNGIterableDataset)):
        return dataset
    if isinstance(dataset, IterableDataset):
        return WorkerRNGIterableDataset(dataset) if _is_stateful(dataset) else dataset
    return WorkerRNGDataset(dataset)


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _problems(loader: Any, name: str, inner_sampler: Callable[[Any], Any]) -> list[str]:
    """What keeps ``loader`` from resuming exactly even after :func:`make_resumable`, each with its fix."""
    if not isinstance(loader, DataLoader):
        if _is_stateful(loader):
            return []
        return [
            f"{name} is a {type(loader).__name__}, not a DataLoader, and has no state_dict(): a resume in the middle "
            "of an epoch starts that epoch again from its first batch. Return a torch DataLoader or torchdata "
            "StatefulDataLoader from train_dataloader(), or give the iterable state_dict()/load_state_dict()."
        ]
    if type(loader) not in _REBUILT_TYPES and not _is_stateful(loader):
        return [
            f"{name} is a {type(loader).__name__}, a DataLoader subclass without state_dict(): a resume in the "
            "middle of an epoch starts that epoch again from its first batch. Derive it from "
            "torchdata.stateful_dataloader.StatefulDataLoader instead of DataLoader."
        ]
    if isinstance(loader.dataset, IterableDataset):
        if _is_stateful(loader.dataset):
            return []
        return [
            f"{name} reads the IterableDataset {type(loader.dataset).__name__}, which has no state_dict(): a resume "
            "reads the epoch again from its start up to the saved position, which is exact only if iterating it is "
            "deterministic, and costs the time of reading it. Give it state_dict()/load_state_dict()."
        ]
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) not in _PLAIN_BATCH_SAMPLERS:
        candidates: list[Any] = [batch_sampler]  # a custom batch sampler is kept as given: nothing seeds it
    else:  # no batch sampler, or one of the plain ones, which are BatchSamplers
        sampler = batch_sampler.sampler if isinstance(batch_sampler, BatchSampler) else loader.sampler
        candidates = [sampler, inner_sampler(sampler)]
    for candidate in candidates:
        if candidate is not None and not _ordered_reproducibly(candidate):
            return [
                f"{name} draws its order from {type(candidate).__name__}, which has no state_dict() and no "
                "set_epoch(): its order after a resume cannot be reproduced. Give it state_dict()/load_state_dict(), "
                "or set_epoch(epoch) with an order that depends only on the seed and the epoch."
            ]
    return []


def _ordered_reproducibly(sampler: Any) -> bool:
    return (
        isinstance(sampler, (SequentialSampler, DistributedSampler, EpochSeededSampler, list, tuple, range))
        or _is_stateful(sampler)
        or callable(getattr(sampler, "set_epoch", None))
        or _draws_from_generator(sampler)  # epoch-seeded by make_resumable
    )
