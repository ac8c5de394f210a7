"""One contract over every public callback: built from kwargs and from the CLI, state round-trips, reusable."""

from __future__ import annotations

import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch import Trainer, seed_everything

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import (
    BudgetedEarlyStopping,
    CostTracker,
    DataStateCheckpoint,
    DivergenceRollback,
    ResumableCheckpoint,
    SpotPreemption,
    WandbResume,
)

SOURCES = (
    '[{"class_path": "lightning_scale.preemption.SignalNotice", "init_args": {"grace_seconds": 20}},'
    ' {"class_path": "lightning_scale.preemption.AWSSpotNotice", "init_args": {"poll_interval": 1}}]'
)
CLI_ARGS = {
    ResumableCheckpoint: ["--cb.dirpath=DIR", "--cb.every_n_train_steps=2", "--cb.every_n_minutes=1.5"],
    DataStateCheckpoint: [],
    SpotPreemption: ["--cb.check_every_n_steps=2", f"--cb.sources={SOURCES}"],
    CostTracker: ["--cb.provider=gcp", "--cb.instance_type=a2-highgpu-1g", "--cb.spot=true", "--cb.num_nodes=2"],
    BudgetedEarlyStopping: ["--cb.monitor=val_loss", "--cb.max_cost_usd=12.5", "--cb.min_improvement_per_usd=0.01"],
    WandbResume: [],
    DivergenceRollback: ["--cb.spike_factor=8", "--cb.window=20", "--cb.max_rollbacks=1"],
}


def build(cls, tmp_path):
    if cls is ResumableCheckpoint:
        return cls(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=2)
    if cls is CostTracker:
        return cls(price_per_hour=2.5)
    if cls is BudgetedEarlyStopping:
        return cls(max_cost_usd=100.0)
    return cls()


def callbacks_for(callback, tmp_path):
    """The callback, plus what it requires: a ResumableCheckpoint, or a CostTracker for budgets."""
    if isinstance(callback, (SpotPreemption, DivergenceRollback)):
        return [callback, ResumableCheckpoint(dirpath=str(tmp_path / "ckpt-spot"))]
    if isinstance(callback, BudgetedEarlyStopping):
        return [callback, CostTracker(price_per_hour=1.0)]
    return [callback]


@pytest.mark.parametrize("cls", list(CLI_ARGS), ids=lambda c: c.__name__)
def test_constructible_from_the_command_line(cls, tmp_path):
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "cb")
    argv = [arg.replace("DIR", str(tmp_path)) for arg in CLI_ARGS[cls]]
    callback = parser.instantiate(parser.parse_args(argv)).cb
    assert isinstance(callback, cls)


def test_bad_value_from_the_command_line_is_refused_with_the_argument_name(tmp_path):
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ResumableCheckpoint, "cb")
    with pytest.raises(ValueError, match=r"every_n_minutes=0\.0 must be > 0"):
        parser.instantiate(parser.parse_args([f"--cb.dirpath={tmp_path}", "--cb.every_n_minutes=0"]))


@pytest.mark.parametrize("cls", list(CLI_ARGS), ids=lambda c: c.__name__)
def test_the_same_instance_serves_repeated_fits_and_teardowns(cls, tmp_path, tiny_trainer_kwargs):
    callback = build(cls, tmp_path)
    for max_steps in (2, 4):
        seed_everything(0)
        trainer = Trainer(max_steps=max_steps, callbacks=callbacks_for(callback, tmp_path), **tiny_trainer_kwargs)
        trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
        assert trainer.global_step == max_steps
        callback.teardown(trainer, trainer.lightning_module, "fit")  # a second teardown is harmless


def test_resumable_checkpoint_state_round_trips(tmp_path, tiny_trainer_kwargs):
    callback = build(ResumableCheckpoint, tmp_path)
    Trainer(max_steps=2, callbacks=[callback], **tiny_trainer_kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    state = callback.state_dict()
    fresh = build(ResumableCheckpoint, tmp_path)
    fresh.dirpath = callback.dirpath
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and state["run_id"]


def test_importing_lightning_scale_registers_data_parallel(tiny_trainer_kwargs):
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_scale

    assert "data_parallel" in StrategyRegistry
    kwargs = {**tiny_trainer_kwargs, "devices": 1}
    trainer = Trainer(strategy="data_parallel", max_steps=1, **kwargs)
    assert isinstance(trainer.strategy, lightning_scale.DataParallelStrategy)


@pytest.mark.parametrize(
    "cls",
    [ResumableCheckpoint, SpotPreemption, CostTracker, BudgetedEarlyStopping, WandbResume, DivergenceRollback],
    ids=lambda c: c.__name__,
)
def test_state_of_an_unknown_version_is_refused_with_the_fix(cls, tmp_path):
    callback = build(cls, tmp_path)
    state = {**callback.state_dict(), "version": 2}
    with pytest.raises(ValueError, match=r"version 2; this lightning-scale reads version 1\. Resume with"):
        callback.load_state_dict(state)


@pytest.mark.parametrize("cls", [c for c in CLI_ARGS if hasattr(c, "METRIC_KEYS")], ids=lambda c: c.__name__)
def test_every_logged_metric_key_is_listed_in_the_docstring(cls):
    doc = " ".join(cls.__doc__.split()).replace("`` ``", "")
    missing = [key for key in cls.METRIC_KEYS if f"``{key}``" not in doc]
    assert not missing, f"{cls.__name__}'s docstring does not list {missing}"
