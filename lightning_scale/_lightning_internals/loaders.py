"""Dataloaders as Lightning prepares them: every loader passed through our functions, the sampler Lightning's DDP puts
in, the user's sampler inside Lightning's wrapper, and stopping workers (items 6, 10, 11, 15)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.data import _auto_add_worker_init_fn, has_iterable_dataset
from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
from lightning.pytorch.trainer.states import RunningStage
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

__all__ = [
    "ddp_sampler_on_one_process",
    "process_dataloaders_with",
    "sampler_in_lightning_wrapper",
    "shut_down_dataloader_workers",
]


_LOADER_CHAIN = "_lightning_scale_loader_chain"  # on the strategy instance: see process_dataloaders_with


def process_dataloaders_with(trainer: pl.Trainer, fn: Callable[[Any], Any], order: int = 0) -> Callable[[], None]:
    """Pass every dataloader Lightning prepares from now on (train, validation, test, predict, and reloads) through
    ``fn``, after Lightning's own preparation and before ``iter()``; ``fn`` returns the loader to use (the one it got,
    changed or not, or a new one). Several functions run in ascending ``order``. Returns the function that undoes
    this one."""
    strategy = trainer.strategy
    chain: list[tuple[int, Callable[[Any], Any]]] | None = vars(strategy).get(_LOADER_CHAIN)
    if chain is None:
        chain = vars(strategy)[_LOADER_CHAIN] = []
        original = strategy.process_dataloader

        def process_dataloader(dataloader: Any) -> Any:
            dataloader = original(dataloader)
            _auto_add_worker_init_fn(dataloader, trainer.global_rank)  # Lightning's next step: it skips a set function
            for _, step in sorted(chain, key=lambda entry: entry[0]):
                dataloader = step(dataloader)
            return dataloader

        strategy.process_dataloader = process_dataloader  # type: ignore[method-assign]
    entry = (order, fn)
    chain.append(entry)

    def undo() -> None:
        if entry in chain:
            chain.remove(entry)
        if not chain:
            vars(strategy).pop("process_dataloader", None)
            vars(strategy).pop(_LOADER_CHAIN, None)

    return undo


def ddp_sampler_on_one_process(trainer: pl.Trainer, loader: Any) -> Any:
    """The sampler Lightning's DDP would put into training loader ``loader`` (a ``DistributedSampler``, or a
    ``DistributedSamplerWrapper`` around a sampler of the user's own) if the world were DDP's with one process: what
    it puts there on several, so that the order of an epoch is the same global one. ``None`` where DDP would inject
    none (``Trainer(use_distributed_sampler=False)``, a loader that is no ``DataLoader``, one that has a distributed
    sampler already, or one over an ``IterableDataset``)."""
    if (
        not isinstance(loader, DataLoader)
        or isinstance(loader.sampler, DistributedSampler)
        or has_iterable_dataset(loader)
        or not trainer._accelerator_connector.use_distributed_sampler
    ):
        return None
    # Lightning shuffles every training loader's distributed sampler (not with overfit_batches), shuffle=False too
    return _get_distributed_sampler(
        loader,
        shuffle=True,
        overfit_batches=trainer.overfit_batches,  # type: ignore[attr-defined]  # set in the Trainer's constructor
        mode=RunningStage.TRAINING,
        num_replicas=1,
        rank=0,
    )


def sampler_in_lightning_wrapper(sampler: Any) -> Any:
    """The user's sampler inside Lightning's ``DistributedSamplerWrapper`` (``None`` for any other sampler)."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    if not isinstance(sampler, DistributedSamplerWrapper):
        return None
    return sampler.dataset._sampler  # type: ignore[attr-defined]  # the wrapper's dataset is a _DatasetSamplerWrapper


def shut_down_dataloader_workers(trainer: pl.Trainer) -> None:
    """Stop the worker processes of every train and validation dataloader (torch's and torchdata's iterators)."""
    loops = [trainer.fit_loop, trainer.fit_loop.epoch_loop.val_loop]
    for combined in (getattr(loop, "_combined_loader", None) for loop in loops):
        if combined is None:
            continue
        mode_iterator = getattr(combined, "_iterator", None)  # holds iterators that loaders without persistent
        iterators = list(getattr(mode_iterator, "iterators", None) or [])  # workers never keep themselves
        iterators += [getattr(loader, "_iterator", None) for loader in combined.flattened]
        for iterator in iterators:
            if callable(getattr(iterator, "_shutdown_workers", None)):
                iterator._shutdown_workers()
        for loader in combined.flattened:
            if getattr(loader, "_iterator", None) is not None:
                loader._iterator = None
