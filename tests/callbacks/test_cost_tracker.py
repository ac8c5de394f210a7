"""CostTracker in single-process fits, driven by a step clock: 450 s per step at 8 USD/h is exactly 1 USD a step."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import CostTracker, ResumableCheckpoint
from lightning_scale.callbacks.cost_tracker import IN_THE_STEPS_ROW
from lightning_scale.cost import PriceCatalogError
from lightning_scale.testing.step_clock import StepClock
from tests.fitting import fit

BATCH = 8


def logged_rows(log_dir: Path) -> list[dict[str, str]]:
    with open(next(log_dir.rglob("metrics.csv"))) as handle:
        return list(csv.DictReader(handle))


def test_every_documented_metric_is_logged_exactly_and_nothing_else(tmp_path, tiny_trainer_kwargs):
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(price_per_hour=8.0, spot=True, on_demand_price_per_hour=20.0, clock=clock.now)
    logger = CSVLogger(tmp_path / "logs")
    fit([clock, tracker], tiny_trainer_kwargs, max_steps=6, logger=logger, log_every_n_steps=2)
    rows = logged_rows(tmp_path / "logs")
    logged = {key for row in rows for key, value in row.items() if value and key.startswith(("cost/", "rightsizing/"))}
    assert logged == set(CostTracker.METRIC_KEYS)  # the docstring's list is what is logged (no monitor here)

    final = rows[-1]
    assert float(final["cost/usd_total"]) == 6.0 and float(final["cost/hours"]) == 0.75
    assert float(final["cost/usd_per_step"]) == 1.0 and float(final["cost/usd_per_hour"]) == 8.0
    assert float(final["cost/usd_per_1k_samples"]) == 6.0 * 1000 / (6 * BATCH)
    assert float(final["cost/savings_vs_on_demand_usd"]) == 20.0 * 0.75 - 6.0
    assert float(final["cost/preemption_waste_usd"]) == 0.0
    steps = [row for row in rows if row["cost/usd_total"] and row["step"] in ("1", "3")]
    assert [float(row["cost/usd_total"]) for row in steps] == [2.0, 4.0]  # logged every 2 steps, as the Trainer logs


def test_a_steps_figures_reach_the_loggers_at_its_step_and_only_the_plotted_ones_through_self_log(
    tmp_path, tiny_trainer_kwargs, monkeypatch
):
    logged_by_self_log: set[str] = set()
    original = LightningModule.log

    def spy(module: LightningModule, name: str, *args: object, **kwargs: object) -> None:
        if module.trainer.training:
            logged_by_self_log.add(name)
        original(module, name, *args, **kwargs)

    monkeypatch.setattr(LightningModule, "log", spy)
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(price_per_hour=8.0, clock=clock.now, progress_bar=False)
    fit([clock, tracker], tiny_trainer_kwargs, max_steps=6, logger=CSVLogger(tmp_path / "logs"), log_every_n_steps=2)
    assert {name for name in logged_by_self_log if name.startswith("cost/")} == set(IN_THE_STEPS_ROW)
    rows = logged_rows(tmp_path / "logs")
    for step, usd in (("1", 2.0), ("3", 4.0)):  # the Trainer's rows of steps 1 and 3, ours beside them
        at_step = {key: float(value) for row in rows if row["step"] == step for key, value in row.items() if value}
        assert at_step["train_loss"] and at_step["cost/usd_total"] == usd and at_step["cost/usd_per_step"] == 1.0
        assert next(row for row in rows if row["step"] == step and row["train_loss"])["cost/usd_total"]


def test_every_node_is_billed(tmp_path, tiny_trainer_kwargs):
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(price_per_hour=8.0, num_nodes=3, clock=clock.now)
    fit([clock, tracker], tiny_trainer_kwargs, max_steps=4)
    assert tracker.report(4).usd_total == 8.0 * 0.5 * 3 == 12.0  # price x hours x nodes


def test_projection_uses_max_steps_and_idle_time_counts_outside_steps(tmp_path, tiny_trainer_kwargs):
    now = [0.0]

    class SlowData(StepClock):  # 3 s per step in the step, then 1 s of waiting for data
        def on_train_batch_start(self, *args):
            now[0] += 1.0

        def on_train_batch_end(self, *args):
            now[0] += 3.0

    tracker = CostTracker(price_per_hour=3600.0, clock=lambda: now[0])  # 1 USD per second
    fit([SlowData(0.0), tracker], tiny_trainer_kwargs, max_steps=5)
    report = tracker.report(5)
    assert report.usd_total == 20.0 and report.idle_fraction == 0.25
    assert report.projected_usd == 20.0  # at max_steps nothing remains


def test_projection_from_max_epochs_at_the_recent_rate(tmp_path, tiny_trainer_kwargs):
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(price_per_hour=8.0, clock=clock.now)
    seen = []

    class Probe(StepClock):  # after the tracker: its report at step 10 of 2 epochs x 44 batches, then the fit stops
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 10:
                seen.append(tracker.report(10).projected_usd)
                trainer.should_stop = True

    fit([clock, tracker, Probe(0.0)], tiny_trainer_kwargs, max_steps=-1, max_epochs=2, limit_train_batches=44)
    assert seen == [88.0]  # 88 steps at 1 USD


def test_a_finished_fit_resumed_to_train_longer_owes_no_restart_gap(tmp_path, tiny_trainer_kwargs):
    ckpt = str(tmp_path / "ckpt")
    clock = StepClock(seconds_per_step=450.0, restart_gap_seconds=900.0)
    checkpoint = ResumableCheckpoint(ckpt, every_n_train_steps=4, save_last=True)
    fit([clock, CostTracker(8.0, clock=clock.now), checkpoint], tiny_trainer_kwargs, max_steps=4)
    clock = StepClock(seconds_per_step=450.0, restart_gap_seconds=900.0)
    tracker = CostTracker(8.0, clock=clock.now)
    trainer = Trainer(max_steps=6, callbacks=[clock, tracker], **tiny_trainer_kwargs)
    trainer.fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=BATCH), ckpt_path=f"{ckpt}/last.ckpt"
    )
    assert tracker.report(6).usd_total == 6.0 and tracker.report(6).preemption_waste_usd == 0.0


def test_barebones_trainer_is_refused_with_the_reason(tiny_trainer_kwargs):
    kwargs = {k: v for k, v in tiny_trainer_kwargs.items() if k not in ("enable_progress_bar", "enable_model_summary")}
    trainer = Trainer(max_steps=1, barebones=True, callbacks=[CostTracker(1.0)], **kwargs)
    with pytest.raises(ValueError, match="barebones=True"):
        trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=BATCH))


class Crash(Callback):
    """Fails the fit at the start of a step, as a lost machine would (after the checkpoint of the previous step)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            raise RuntimeError("machine lost")


def crash_then_resume(tmp_path, tiny_trainer_kwargs, at, max_steps, gap_seconds, **tracker_kwargs):
    ckpt = str(tmp_path / "ckpt")
    clock = StepClock(seconds_per_step=450.0)
    crashed = [clock, CostTracker(8.0, clock=clock.now), ResumableCheckpoint(ckpt, every_n_train_steps=at), Crash(at)]
    with pytest.raises(RuntimeError, match="machine lost"):
        fit(crashed, tiny_trainer_kwargs, max_steps=max_steps)
    clock = StepClock(seconds_per_step=450.0, restart_gap_seconds=gap_seconds)
    tracker = CostTracker(8.0, clock=clock.now, **tracker_kwargs)
    fit([clock, tracker, ResumableCheckpoint(ckpt, every_n_train_steps=at)], tiny_trainer_kwargs, max_steps=max_steps)
    return tracker


def test_totals_continue_in_a_resumed_fit_with_the_gap_as_preemption_waste(tmp_path, tiny_trainer_kwargs):
    tracker = crash_then_resume(tmp_path, tiny_trainer_kwargs, at=4, max_steps=10, gap_seconds=900.0)
    report = tracker.report(10)
    assert report.usd_total == 12.0  # 10 steps + a 900 s gap at 1 USD per 450 s
    assert report.preemption_waste_usd == 2.0 and report.usd_per_step == 1.2
    assert tracker.meter.last_gap_seconds == 900.0


def test_a_restart_gap_longer_than_the_limit_is_billed_up_to_it(tmp_path, tiny_trainer_kwargs):
    week = 7 * 24 * 3600.0  # resumed by hand a week later
    tracker = crash_then_resume(tmp_path, tiny_trainer_kwargs, 2, 4, week, max_restart_gap_minutes=15)
    assert tracker.report(4).usd_total == 4.0 + 8.0 * 0.25  # 4 steps + 15 min, not a week


def test_usd_at_the_best_checkpoint_monitor_is_logged(tmp_path, tiny_trainer_kwargs):
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(price_per_hour=8.0, clock=clock.now)
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="val_loss")
    kwargs = {"logger": CSVLogger(tmp_path / "logs"), "limit_val_batches": 2, "val_check_interval": 2}
    fit([clock, tracker, best], tiny_trainer_kwargs, max_steps=6, **kwargs)
    assert [e["step"] for e in tracker.evaluations] == [2, 4, 6]
    assert [e["usd_total"] for e in tracker.evaluations] == [2.0, 4.0, 6.0]
    losses = [e["metrics"]["val_loss"] for e in tracker.evaluations]
    best_index = losses.index(min(losses))
    assert tracker.best["val_loss"] == {
        "value": losses[best_index],
        "step": 2 * (best_index + 1),
        "usd": 2.0 * (best_index + 1),
    }
    logged = [
        float(row["cost/usd_at_best_val_loss"])
        for row in logged_rows(tmp_path / "logs")
        if row.get("cost/usd_at_best_val_loss")
    ]
    assert logged[-1] == tracker.best["val_loss"]["usd"]
    rows = logged_rows(tmp_path / "logs")
    assert any(row["val_loss"] and row["cost/usd_total"] for row in rows)  # cost in the validation rows: an x-axis


def test_wandb_gets_pricing_config_summary_and_cost_table(tmp_path, tiny_trainer_kwargs):
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(provider="aws", instance_type="p4d.24xlarge", num_nodes=2, clock=clock.now)
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="cost")
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="val_loss")
    kwargs = {"logger": logger, "limit_val_batches": 2, "val_check_interval": 2}
    try:
        fit([clock, tracker, best], tiny_trainer_kwargs, max_steps=4, **kwargs)
        run = logger.experiment
        price = tracker.pricing.row.on_demand_usd_per_hour
        assert run.config["cost/provider"] == "aws" and run.config["cost/num_nodes"] == 2
        assert run.config["cost/usd_per_hour"] == price * 2 and run.config["cost/price_date"]
        assert run.config["cost/price_url"].startswith("https://")
        assert run.summary["cost/usd_total"] == pytest.approx(price * 2 * 0.5)  # 2 nodes, 4 steps of 450 s
        assert {"cost/usd_at_best_val_loss", "rightsizing/busy_fraction"} <= set(run.summary.keys())
    finally:
        logger.experiment.finish()
    tables = list(tmp_path.rglob("files/media/table/cost/table_*.table.json"))
    assert len(tables) == 1


def test_right_sizing_report_is_printed_at_the_end(tmp_path, tiny_trainer_kwargs, caplog):
    clock = StepClock(seconds_per_step=450.0)
    with caplog.at_level("INFO"):
        fit([clock, CostTracker(price_per_hour=1.0, clock=clock.now)], tiny_trainer_kwargs, max_steps=2)
    text = caplog.text
    assert "Right-sizing: peak memory" in text and "of capacity" in text  # a CPU run uses a sliver of this machine
    assert "Cost: $0.2500 for 2 steps" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"price_per_hour": -1.0}, r"price_per_hour=-1.0 must be >= 0"),
        ({}, r"needs a price: price_per_hour="),
        ({"provider": "aws"}, r"instance_type=None"),
        ({"provider": "oracle", "instance_type": "x"}, r"provider='oracle' is not in the price catalog"),
        ({"provider": "aws", "instance_type": "p4d.24xlarg"}, r"close matches: \['p4d.24xlarge'"),
        ({"price_per_hour": 1.0, "num_nodes": 0}, r"num_nodes=0 must be >= 1"),
        ({"price_per_hour": 1.0, "max_restart_gap_minutes": -1}, r"max_restart_gap_minutes=-1"),
    ],
)
def test_bad_pricing_is_refused_at_construction(kwargs, message):
    with pytest.raises((ValueError, PriceCatalogError), match=message):
        CostTracker(**kwargs)


def test_state_round_trips_and_an_unknown_version_is_refused(tmp_path, tiny_trainer_kwargs):
    clock = StepClock(seconds_per_step=450.0)
    tracker = CostTracker(price_per_hour=8.0, clock=clock.now)
    fit([clock, tracker], tiny_trainer_kwargs, max_steps=2)
    state = tracker.state_dict()
    assert state["meter"]["seconds"] == 900.0 and state["version"] == 1
    with pytest.raises(ValueError, match="version 2"):
        CostTracker(price_per_hour=8.0).load_state_dict({**state, "version": 2})
    assert not math.isnan(state["meter"]["saved_at"])
