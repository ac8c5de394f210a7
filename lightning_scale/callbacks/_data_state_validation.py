"""Validation inside fit leaves the training's random generators as it found them.

A validation draws from the global generators: ``val_dataloader()`` (a random subset), a shuffled loader's sampler
seed, a persistent loader's worker seed when its first iterator is built, dropout left on in ``validation_step``. A
resumed run does not repeat those draws: Lightning skips the validation of the step a checkpoint was written at (the
checkpoint precedes it), sets the loaders up without a sanity check, and builds a persistent loader's iterator again
at its first validation. So each validation, each skip of one and each set-up of its loaders runs between a capture
and a restore of the generators, as Lightning's own sanity check does (``isolate_rng``); a checkpoint written
meanwhile holds the states training goes on with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl

from lightning_scale._lightning_internals import during_fit_validation
from lightning_scale.rng import capture_rng_state, restore_rng_state

__all__ = ["TrainingRng"]


class TrainingRng:
    """The RNG states of training: the current ones, or while a validation of the fit runs, those it started from."""

    def __init__(self) -> None:
        self._during_validation: dict[str, Any] | None = None
        self._depth = 0  # a validation sets its loaders up inside itself: the outermost captures and restores
        self._undo: Callable[[], None] | None = None  # not a lambda: callbacks pickle (ddp_spawn)

    def attach(self, trainer: pl.Trainer) -> None:
        """Shield training's generators from every validation of ``trainer``'s fit (until :meth:`detach`)."""
        self._undo = during_fit_validation(trainer, self._validation)

    def detach(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def state(self) -> dict[str, Any]:
        """The states a checkpoint must hold: those training goes on with."""
        return capture_rng_state() if self._during_validation is None else self._during_validation

    @contextmanager
    def _validation(self) -> Iterator[None]:
        outermost = self._depth == 0
        if outermost:
            self._during_validation = capture_rng_state()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if outermost:
                assert self._during_validation is not None
                restore_rng_state(self._during_validation)
                self._during_validation = None
