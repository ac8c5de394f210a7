"""Importable model and data factories for tests that train in fresh processes."""

from __future__ import annotations

import multiprocessing

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.data.forkserver import FORKSERVER_PRELOAD


def model() -> CharTransformer:
    return CharTransformer(vocab_size=64, dropout=0.1)


def data_workers0() -> CharDataModule:
    return CharDataModule(batch_size=8, num_workers=0, augment=True)


def data_workers2() -> CharDataModule:
    return CharDataModule(batch_size=8, num_workers=2, augment=True, multiprocessing_context=_forkserver())


def data_workers2_fork() -> CharDataModule:
    """Workers forked by the rank itself: their deaths reach it at once (SIGCHLD), which is what a job-wide signal
    test needs. One process and no gloo threads keep the fork hazard (below) remote."""
    return CharDataModule(batch_size=8, num_workers=2, augment=True, multiprocessing_context="fork")


def _forkserver() -> str:
    """Workers forked from a server process that runs no other thread. Forked by a rank itself, while gloo's threads
    and the other loader's queue feeders ran, a worker deadlocked inside ``os.fork()`` about once in three CI runs.
    The server imports what lightning-scale's own forkserver does (torch and Lightning, frozen out of the collector)
    and the example once per rank, so workers start in milliseconds."""
    multiprocessing.set_forkserver_preload([*FORKSERVER_PRELOAD, "examples.char_transformer"])
    return "forkserver"


class PoisonedTransformer(CharTransformer):
    """Returns a NaN loss on ``rank`` at the training steps in ``steps`` (once each), as a diverging run would."""

    def __init__(self, steps: tuple[int, ...], rank: int | None = None, factor: float = float("nan")) -> None:
        super().__init__(vocab_size=64, dropout=0.1)
        self.poison, self.poison_rank, self.factor = set(steps), rank, factor

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.global_step in self.poison and self.poison_rank in (None, self.global_rank):
            self.poison.discard(self.global_step)
            return loss * self.factor
        return loss


def model_nan_on_rank1_at_step_6() -> CharTransformer:
    return PoisonedTransformer(steps=(6,), rank=1)
