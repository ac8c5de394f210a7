"""BudgetedEarlyStopping in single-process fits with a step clock (450 s per step at 8 USD/h: 1 USD a step)."""

from __future__ import annotations

import csv

import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_scale.callbacks import BudgetedEarlyStopping, CostTracker, ResumableCheckpoint
from lightning_scale.testing.step_clock import StepClock
from tests.fitting import fit


def priced(**budget):
    clock = StepClock(seconds_per_step=450.0)
    return [clock, CostTracker(price_per_hour=8.0, clock=clock.now), BudgetedEarlyStopping(**budget)]


def test_max_cost_stops_after_the_step_that_reaches_it_and_logs_the_documented_metrics(
    tmp_path, tiny_trainer_kwargs, caplog
):
    callbacks = priced(max_cost_usd=3.0)
    with caplog.at_level("INFO"):
        trainer = fit(callbacks, tiny_trainer_kwargs, max_steps=20, logger=CSVLogger(tmp_path))
    assert trainer.global_step == 3 and callbacks[2].budget_reason == "max_cost_usd"
    assert "Budget reached (max_cost_usd): $3.0000 >= $3.0 after step 3. Stopping." in caplog.text
    with open(next(tmp_path.rglob("metrics.csv"))) as handle:
        rows = list(csv.DictReader(handle))
    logged = {key for row in rows for key, value in row.items() if value and key.startswith("early_stopping/")}
    assert logged == set(BudgetedEarlyStopping.METRIC_KEYS)
    assert [float(row["early_stopping/usd_total"]) for row in rows if row["early_stopping/usd_total"]] == [3.0]


def test_max_hours_stops_on_billed_time(tiny_trainer_kwargs):
    callbacks = priced(max_hours=0.5)  # 4 steps of 450 s
    trainer = fit(callbacks, tiny_trainer_kwargs, max_steps=20)
    assert trainer.global_step == 4 and callbacks[2].budget_reason == "max_hours"
    assert callbacks[2].stopping_reason_message.startswith("Budget reached (max_hours): 0.500 h >= 0.5 h")


def test_the_budget_survives_a_resume(tmp_path, tiny_trainer_kwargs):
    ckpt = str(tmp_path / "ckpt")
    first = fit([*priced(max_cost_usd=6.0), ResumableCheckpoint(ckpt, every_n_train_steps=2)], tiny_trainer_kwargs, 4)
    assert first.global_step == 4
    resumed = fit(
        [*priced(max_cost_usd=6.0), ResumableCheckpoint(ckpt, every_n_train_steps=2)], tiny_trainer_kwargs, 20
    )
    assert resumed.global_step == 6  # the first 4 USD were counted


class Scripted(LightningModule):
    """Logs a given validation score per evaluation, so the improvement per USD is known exactly."""

    def __init__(self, scores):
        super().__init__()
        self.scores = list(scores)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("score", self.scores.pop(0) if self.scores else 0.0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(64, 2)), batch_size=1)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(1, 2)), batch_size=1)


def test_too_little_improvement_per_usd_stops_and_says_why(tiny_trainer_kwargs):
    # evaluations every 2 steps = every 2 USD; losses fall by 1.0, 1.0, then 0.1 per evaluation
    stopper = BudgetedEarlyStopping(monitor="score", min_improvement_per_usd=0.2, window=2)
    clock = StepClock(seconds_per_step=450.0)
    callbacks = [clock, CostTracker(price_per_hour=8.0, clock=clock.now), stopper]
    kwargs = {"limit_val_batches": 1, "val_check_interval": 2, "num_sanity_val_steps": 0}
    trainer = fit(callbacks, tiny_trainer_kwargs, 40, model=lambda: Scripted([9.0, 8.0, 7.0, 6.9, 6.8, 6.7]), **kwargs)
    # at the 4th evaluation the last 2 improved 1.1 for 4 USD (0.275/USD); at the 5th 0.2 for 4 USD (0.05/USD): stop
    assert (trainer.global_step, stopper.budget_reason) == (10, "min_improvement_per_usd"), (
        stopper.stopping_reason_message,
        stopper.evaluations,
    )
    assert "improved by 0.2 for $4.0000 over the last 2 evaluations: 0.05 per USD" in stopper.stopping_reason_message
    assert [usd for usd, _ in stopper.evaluations] == [2.0, 4.0, 6.0, 8.0, 10.0]


def test_state_round_trips_with_evaluations_and_reason():
    stopper = BudgetedEarlyStopping(monitor="val_loss", max_cost_usd=10.0)
    stopper.evaluations, stopper.budget_reason = [(1.0, 3.0), (2.0, 2.5)], "max_cost_usd"
    fresh = BudgetedEarlyStopping(monitor="val_loss", max_cost_usd=10.0)
    fresh.load_state_dict(stopper.state_dict())
    assert fresh.evaluations == [(1.0, 3.0), (2.0, 2.5)] and fresh.budget_reason == "max_cost_usd"
    with pytest.raises(ValueError, match="version 7"):
        fresh.load_state_dict({**stopper.state_dict(), "version": 7})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_improvement_per_usd": 0.1}, r"needs the metric whose improvement is bought: pass monitor="),
        ({"max_cost_usd": 0}, r"max_cost_usd=0 must be > 0"),
        ({"max_hours": -2}, r"max_hours=-2 must be > 0"),
        ({"monitor": "x", "min_improvement_per_usd": -1}, r"min_improvement_per_usd=-1 must be >= 0"),
        ({"window": 0}, r"window=0"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BudgetedEarlyStopping(**kwargs)


def test_a_budget_without_a_cost_tracker_is_refused_at_setup(tiny_trainer_kwargs):
    with pytest.raises(ValueError, match=r"there is none: add lightning_scale.callbacks.CostTracker"):
        fit([BudgetedEarlyStopping(max_cost_usd=1.0)], tiny_trainer_kwargs, max_steps=2)
