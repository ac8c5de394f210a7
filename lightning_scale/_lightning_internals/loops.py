"""The fit loop's private parts: when its training iterator starts, its batch counts, reloading its loaders, and the
loader states of the batch it consumed (items 2, 3, 4, 14)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from lightning_scale import knobs

__all__ = [
    "CHECKPOINT_FIT_LOOP_KEYS",
    "before_train_iterator",
    "consumed_batches_in_epoch",
    "consumed_loader_states",
    "drop_lightning_loader_state",
    "during_fit_validation",
    "is_last_batch_of_epoch",
    "reload_train_loaders_after",
    "shift_batches_in_epoch",
    "track_loader_states_when_fetching_ahead",
    "train_loaders",
]


CHECKPOINT_FIT_LOOP_KEYS = ("loops", "fit_loop", "state_dict")


def before_train_iterator(trainer: pl.Trainer, fn: Callable[[list[Any]], None]) -> None:
    """Call ``fn(train_loaders)`` after Lightning loads loader states and before it creates the train iterator."""
    fit_loop = trainer.fit_loop
    original = type(fit_loop)._load_combined_loader_states

    def load_then_call() -> None:
        original(fit_loop)
        if fit_loop._combined_loader is not None:
            fn(list(fit_loop._combined_loader.flattened))

    fit_loop._load_combined_loader_states = load_then_call  # type: ignore[method-assign]  # on this instance


_VALIDATION_ENTRIES = ("run", "increment_progress_to_evaluation_end", "setup_data")
"""The fit's validation loop's methods that call ``val_dataloader()`` or build its loaders' iterators: a validation,
the skip of the one a resumed run's checkpoint was written before, and the set-up of its loaders at a fit's start
(without a sanity check: always on resume)."""


def during_fit_validation(trainer: pl.Trainer, around: Callable[[], ContextManager[Any]]) -> Callable[[], None]:
    """Run every validation of this Trainer's fit (the sanity check too), every skip of one on resume and every set-up
    of its loaders inside ``around()``, from before ``val_dataloader()`` runs or an iterator is built to after the
    last hook (item 21); ``around`` is entered again inside itself (a validation sets its loaders up). Another call
    replaces the wrapping (a second fit of the Trainer after a failed one, whose callbacks' teardown Lightning
    skips); returns the undo."""
    val_loop = trainer.fit_loop.epoch_loop.val_loop

    def wrapped(original: Callable[[Any], Any]) -> Callable[[], Any]:
        def entry() -> Any:
            with around():
                return original(val_loop)

        return entry

    for name in _VALIDATION_ENTRIES:
        setattr(val_loop, name, wrapped(getattr(type(val_loop), name)))  # on this instance, over the class's

    def undo() -> None:
        for name in _VALIDATION_ENTRIES:
            vars(val_loop).pop(name, None)

    return undo


def shift_batches_in_epoch(checkpoint: dict[str, Any], delta: int) -> None:
    """Move the count of the current epoch's batches in a checkpoint's fit-loop state by ``delta`` (before the
    Trainer restores its loops from it)."""
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    for scope in ("current", "total"):
        for key, value in progress[scope].items():
            progress[scope][key] = value + delta


def reload_train_loaders_after(trainer: pl.Trainer, epoch: int) -> None:
    """Have the fit loop build its training loaders again (``train_dataloader()`` and every loader processing) at
    the start of the first epoch after ``epoch``, as ``reload_dataloaders_every_n_epochs`` would."""
    fit_loop = trainer.fit_loop
    original = type(fit_loop).setup_data

    def setup_data() -> None:
        if trainer.current_epoch > epoch:
            del fit_loop.setup_data  # once: the class method is visible again
            fit_loop._combined_loader = None
        original(fit_loop)

    fit_loop.setup_data = setup_data  # type: ignore[method-assign]  # on this instance, until it reloads


def train_loaders(trainer: pl.Trainer) -> list[Any]:
    """The training dataloaders of the running fit, flattened; empty before the fit loop set them up."""
    combined = trainer.fit_loop._combined_loader
    return [] if combined is None else list(combined.flattened)


def consumed_batches_in_epoch(trainer: pl.Trainer) -> int:
    """Batches the training loop has taken from the loader in the current epoch."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)


def is_last_batch_of_epoch(trainer: pl.Trainer) -> bool:
    """Whether the batch just consumed was the epoch's last one (so a resume starts the next epoch)."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def drop_lightning_loader_state(checkpoint: dict[str, Any]) -> None:
    """Remove Lightning's own loader state (rank 0's, which every rank would load) from a checkpoint dict."""
    node: Any = checkpoint
    for key in CHECKPOINT_FIT_LOOP_KEYS:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop("combined_loader", None)


class _StateTrackingCombinedLoader(CombinedLoader):
    """A ``CombinedLoader`` that remembers its loaders' states after each of the last few batches it returned."""

    state_history: deque[list[Any]]

    def __iter__(self) -> _StateTrackingCombinedLoader:
        self.state_history = deque(maxlen=knobs.LOADER_STATE_HISTORY)
        return super().__iter__()

    def __next__(self) -> Any:
        out = super().__next__()
        self.state_history.append([_state_or_none(loader) for loader in self.flattened])
        return out


def _state_or_none(loader: Any) -> Any:
    return loader.state_dict() if callable(getattr(loader, "state_dict", None)) else None


def track_loader_states_when_fetching_ahead(trainer: pl.Trainer) -> None:
    """Keep per-batch loader states for loaders without a length, the only ones Lightning fetches ahead for.

    Call right before the train iterator is created; loaders with a length cost nothing.
    """
    combined = trainer.fit_loop._combined_loader
    if type(combined) is CombinedLoader and any(sized_len(loader) is None for loader in combined.flattened):
        combined.__class__ = _StateTrackingCombinedLoader


def consumed_loader_states(trainer: pl.Trainer) -> list[Any]:
    """Each training loader's ``state_dict()`` (``None`` if it has none) as of the last batch the loop consumed."""
    combined = trainer.fit_loop._combined_loader
    if combined is None:
        return []
    ahead = len(getattr(trainer.fit_loop._data_fetcher, "batches", ()))
    if ahead == 0:
        return [_state_or_none(loader) for loader in combined.flattened]
    history = getattr(combined, "state_history", ())
    if len(history) <= ahead:
        raise RuntimeError(
            f"Lightning fetched {ahead} batch(es) ahead but only {len(history)} loader state(s) were recorded; "
            "the data position cannot be saved exactly. Please report this with your Lightning version."
        )
    return history[-1 - ahead]
