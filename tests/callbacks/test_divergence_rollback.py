"""DivergenceRollback: a NaN or spiking loss rolls the weights back to the last good checkpoint; repeated, it stops."""

from __future__ import annotations

import csv

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from examples.char_transformer import CharDataModule
from lightning_scale.callbacks import DivergenceRollback, ResumableCheckpoint
from lightning_scale.testing import assert_same_tensors
from tests import fitting
from tests.factories import PoisonedTransformer


def fit(tmp_path, tiny_trainer_kwargs, model, rollback, max_steps=12, **kwargs):
    checkpoint = ResumableCheckpoint(str(tmp_path / "ckpt"), every_n_train_steps=5, keep_last_k=None)
    data = CharDataModule(batch_size=8)
    return fitting.fit(
        [checkpoint, rollback], tiny_trainer_kwargs, max_steps, model=lambda: model, datamodule=data, **kwargs
    )


def weights_of_step(tmp_path, step):
    path = next((tmp_path / "ckpt").glob(f"*step={step}.ckpt"))
    return torch.load(path, weights_only=False)["state_dict"]


class Snapshot(DivergenceRollback):
    """Records the weights right after each rollback."""

    snapshots: list[dict[str, torch.Tensor]] = []

    def _roll_back(self, trainer, loss):
        super()._roll_back(trainer, loss)
        Snapshot.snapshots.append({k: v.clone() for k, v in trainer.lightning_module.state_dict().items()})


def test_a_nan_loss_rolls_back_to_the_last_checkpoint_and_training_goes_on(tmp_path, tiny_trainer_kwargs):
    Snapshot.snapshots = []
    rollback = Snapshot()
    logger = CSVLogger(tmp_path / "logs")
    trainer = fit(tmp_path, tiny_trainer_kwargs, PoisonedTransformer(steps=(6,)), rollback, logger=logger)
    assert trainer.global_step == 12 and rollback.rollbacks == 1
    restored = weights_of_step(tmp_path, 5)
    assert_same_tensors(Snapshot.snapshots[0], restored, "restored weights")  # exactly step 5's weights
    assert all(torch.isfinite(p).all() for p in trainer.lightning_module.parameters())
    with open(next((tmp_path / "logs").rglob("metrics.csv"))) as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("divergence/rollbacks")]
    assert [(row["divergence/rollbacks"], row["divergence/rolled_back_to_step"]) for row in rows] == [("1.0", "5.0")]
    assert {key for key in rows[0] if key.startswith("divergence/") and rows[0][key]} == set(rollback.METRIC_KEYS)


def test_a_loss_spike_counts_as_divergence(tmp_path, tiny_trainer_kwargs):
    rollback = DivergenceRollback(spike_factor=5.0, window=4)
    trainer = fit(tmp_path, tiny_trainer_kwargs, PoisonedTransformer(steps=(7,), factor=1000.0), rollback)
    assert rollback.rollbacks == 1 and trainer.global_step == 12


def test_divergence_after_max_rollbacks_rolls_back_once_more_and_stops(tmp_path, tiny_trainer_kwargs):
    rollback = DivergenceRollback(max_rollbacks=1)
    trainer = fit(tmp_path, tiny_trainer_kwargs, PoisonedTransformer(steps=(6, 8)), rollback, max_steps=20)
    assert rollback.rollbacks == 2 and trainer.global_step == 9  # stopped after the step that diverged again
    final = trainer.lightning_module.state_dict()
    assert_same_tensors(final, weights_of_step(tmp_path, 5), "final weights")  # no diverged weights


def test_without_a_resumable_checkpoint_it_is_refused_at_setup(tiny_trainer_kwargs):
    trainer = Trainer(max_steps=1, callbacks=[DivergenceRollback()], **tiny_trainer_kwargs)
    with pytest.raises(ValueError, match=r"add lightning_scale\.callbacks\.ResumableCheckpoint"):
        trainer.fit(PoisonedTransformer(steps=()), datamodule=CharDataModule(batch_size=8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spike_factor": 1.0}, "spike_factor=1.0 must be > 1"),
        ({"window": 1}, "window=1"),
        ({"max_rollbacks": -1}, "-1"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DivergenceRollback(**kwargs)
