"""A training loader's own state as :class:`~lightning_scale.callbacks.DataStateCheckpoint` saves and restores it: its
``state_dict()``, the generators of the loader and its samplers, and its samplers' epoch."""

from __future__ import annotations

from typing import Any

import torch

from lightning_scale.callbacks._data_state_format import LoaderState

__all__ = ["generators", "loader_state", "restore_generators", "restore_loader", "set_sampler_epoch"]

_ITERATOR_FINISHED = "_iterator_finished"  # torchdata StatefulDataLoader state key


def _is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _samplers(loader: Any) -> list[Any]:
    found = []
    for name in ("sampler", "batch_sampler"):
        sampler = getattr(loader, name, None)
        if sampler is not None:
            found.append(sampler)
            inner = getattr(sampler, "sampler", None)
            if inner is not None:
                found.append(inner)
    return found


def generators(loader: Any) -> dict[str, torch.Generator]:
    """The ``torch.Generator``\\ s of ``loader`` and of its samplers, by where they sit."""
    found = {}
    if isinstance(getattr(loader, "generator", None), torch.Generator):
        found["loader"] = loader.generator
    for index, sampler in enumerate(_samplers(loader)):
        if isinstance(getattr(sampler, "generator", None), torch.Generator):
            found[f"sampler_{index}"] = sampler.generator
    return found


def loader_state(loader: Any, state: dict[str, Any] | None) -> LoaderState:
    """``loader``'s checkpointed state: ``state`` (its ``state_dict()`` at the consumed batch) and its generators."""
    return LoaderState(state, {name: generator.get_state() for name, generator in generators(loader).items()})


def restore_generators(loader: Any, saved: dict[str, torch.Tensor]) -> None:
    for name, generator in generators(loader).items():
        if name in saved:
            generator.set_state(saved[name])


def restore_loader(loader: Any, saved: LoaderState, end_of_epoch: bool) -> None:
    """Put ``loader`` where ``saved`` was: mid-epoch its position; at an epoch's end, ready for the next epoch."""
    state = saved.state
    if not end_of_epoch:
        if state is not None and _is_stateful(loader):
            loader.load_state_dict(state)
        return
    if state is not None and _is_stateful(loader) and getattr(loader, "persistent_workers", False):
        # Persistent workers carry their RNG into the next epoch: restore them and mark the epoch finished, so
        # that StatefulDataLoader starts the next epoch instead of yielding an exhausted iterator.
        loader.load_state_dict({**state, _ITERATOR_FINISHED: True})
    else:
        restore_generators(loader, saved.generators)


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    for sampler in _samplers(loader):
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)
