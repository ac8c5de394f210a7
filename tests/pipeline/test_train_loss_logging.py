"""pipeline_parallel logs ``train_loss`` on the steps where something reads it (``log_train_loss="when_read"``) and
returns the loss on every step; one process (a pipeline of one stage), no launch. The loss reaching the first stage
on two processes: tests/pipeline/test_pipeline_parallel.py (its losses are the ``outputs`` of every step, rank 0's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import Logger

from lightning_scale.strategies import PipelineParallelStrategy
from tests.pipeline.stack_model import StackModel, loader

STEPS = 10


class Recorder(Callback):
    """Each step's loss from ``outputs`` and ``trainer.callback_metrics["train_loss"]`` after it."""

    def __init__(self) -> None:
        self.outputs: list[float] = []
        self.callback_metrics: list[float | None] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.outputs.append(float(outputs["loss"]))
        value = trainer.callback_metrics.get("train_loss")
        self.callback_metrics.append(None if value is None else float(value))


class MemoryLogger(Logger):
    """The ``train_loss`` the Trainer writes, by 0-based step."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[int, float] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "train_loss" in metrics:
            assert step is not None
            self.written[step] = metrics["train_loss"]


def fit(tmp_path, log_train_loss: str = "when_read", callbacks: tuple[Callback, ...] = (), **trainer: Any) -> Recorder:
    seed_everything(0)
    recorder = Recorder()
    options: dict[str, Any] = {"logger": False, "enable_progress_bar": False, "enable_checkpointing": False} | trainer
    Trainer(
        accelerator="cpu", devices=1, strategy=PipelineParallelStrategy(log_train_loss=log_train_loss),
        max_steps=STEPS, callbacks=[recorder, *callbacks], enable_model_summary=False, default_root_dir=tmp_path,
        use_distributed_sampler=False, **options,
    ).fit(StackModel(), train_dataloaders=loader())  # fmt: skip
    assert len(recorder.outputs) == STEPS  # the loss on every step, logged or not
    return recorder


def logged_steps(recorder: Recorder) -> list[int]:
    """The steps whose callback_metrics hold that step's loss; on the others they hold the latest one logged."""
    logged, latest = [], None
    for step, (loss, metric) in enumerate(zip(recorder.outputs, recorder.callback_metrics, strict=True)):
        if metric == loss and (latest is None or loss != recorder.outputs[latest]):
            logged.append(step)
            latest = step
        else:
            assert metric == (None if latest is None else recorder.outputs[latest]), (step, metric, latest)
    return logged


def test_the_loss_is_logged_on_the_loggers_steps_and_the_last_one(tmp_path):
    logger = MemoryLogger()
    recorder = fit(tmp_path, logger=logger, log_every_n_steps=4)
    assert logged_steps(recorder) == [3, 7, 9]  # the loggers' steps, then max_steps: callback_metrics after fit
    assert logger.written == {3: recorder.outputs[3], 7: recorder.outputs[7]}  # this step's loss, never a stale one


def test_the_loss_is_logged_when_the_progress_bar_refreshes(tmp_path):
    recorder = fit(tmp_path, callbacks=(TQDMProgressBar(refresh_rate=3),), enable_progress_bar=True)
    assert logged_steps(recorder) == [2, 5, 8, 9]


@pytest.mark.parametrize(
    "callback",
    [
        EarlyStopping(monitor="train_loss", patience=100, check_on_train_epoch_end=True),
        ModelCheckpoint(filename="{step}-{train_loss:.3f}", every_n_train_steps=100),
    ],
    ids=["monitor", "checkpoint-filename"],
)
def test_the_loss_is_logged_on_every_step_while_a_callback_reads_it(tmp_path, callback):
    recorder = fit(tmp_path, callbacks=(callback,), enable_checkpointing=isinstance(callback, ModelCheckpoint))
    assert recorder.callback_metrics == recorder.outputs


def test_every_step_logs_it_on_every_step_and_trains_alike(tmp_path):
    every = fit(tmp_path, log_train_loss="every_step", log_every_n_steps=50)
    assert every.callback_metrics == every.outputs
    when_read = fit(tmp_path, log_every_n_steps=50)
    assert logged_steps(when_read) == [STEPS - 1]
    assert torch.equal(torch.tensor(when_read.outputs), torch.tensor(every.outputs))


def test_an_unknown_choice_is_refused_with_the_argument_to_change():
    with pytest.raises(ValueError, match=r"log_train_loss='sometimes' is not 'when_read' or 'every_step' "):
        PipelineParallelStrategy(log_train_loss="sometimes")  # type: ignore[arg-type]
