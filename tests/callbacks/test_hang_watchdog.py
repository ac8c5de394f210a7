"""HangWatchdog in a fit: a rank stuck in training_step exits 75 with its stacks; a slow step, a long validation and
a long save of a healthy run do not."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

from examples.char_transformer import CharTransformer
from lightning_scale.callbacks import HangWatchdog, ResumableCheckpoint
from lightning_scale.callbacks.hang_watchdog import COLLECTIVE_MARGIN_S
from tests import fitting


class _Released(Exception):
    """Ends a training_step that the test's watchdog released."""


class FakeClock:
    """The watchdog's seconds, which pass only where a test's model says: steps that a loaded machine makes slow take
    none of them (a real clock once let a 10 ms step outlast a 1 s allowance in a full run)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


CLOCK = FakeClock()


class StuckAtStep(CharTransformer):
    stuck_step = 5
    release = threading.Event()  # set by the test's watchdog

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 == self.stuck_step:
            CLOCK.seconds += 10.0  # stuck in user code: its time passes, until the watchdog fires
            self.release.wait(30)
            raise _Released
        return super().training_step(batch, batch_idx)


def test_a_rank_stuck_in_training_step_exits_75_within_its_allowance_with_its_stacks(tiny_trainer_kwargs, capfd):
    release, exits = StuckAtStep.release, []
    release.clear()
    watchdog = HangWatchdog(timeout_s=1.0, startup_timeout_s=20.0)
    watchdog.exit_fn = lambda code: (exits.append(code), release.set())
    watchdog.clock = CLOCK
    started = time.monotonic()
    with pytest.raises(_Released):
        fitting.fit([watchdog], tiny_trainer_kwargs, 10, model=lambda: StuckAtStep(vocab_size=64),
                    datamodule=fitting.CharDataModule(batch_size=8))  # fmt: skip
    assert exits == [75] and time.monotonic() - started < 25  # it fired within a second of the step's overrun
    err = capfd.readouterr().err
    assert "made no progress for 10 s in training step 5 (epoch 0, batch 4)" in err
    assert "in training_step" in err  # the stuck thread's stack


class SlowButHealthy(CharTransformer):
    """A 1 s training step (50 times the others), validation batches of 0.8 s, and a save that takes 10 s, on the
    watchdog's clock (each also sleeps a tenth of that)."""

    def _takes(self, seconds: float) -> None:
        CLOCK.seconds += seconds
        time.sleep(seconds / 10)

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            self._takes(1.0)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._takes(0.8)
        return super().validation_step(batch, batch_idx)

    def on_save_checkpoint(self, checkpoint) -> None:
        self._takes(10.0)


def test_a_slow_step_a_long_validation_and_a_long_save_of_a_healthy_run_are_not_killed(tiny_trainer_kwargs, tmp_path):
    exits: list[int] = []
    watchdog = HangWatchdog(min_timeout_s=2.0, step_factor=3.0, startup_timeout_s=5.0)
    watchdog.exit_fn = exits.append
    watchdog.clock = CLOCK
    checkpoint = ResumableCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=4)
    trainer = fitting.fit(
        [watchdog, checkpoint], tiny_trainer_kwargs, 5,
        model=lambda: SlowButHealthy(vocab_size=64), datamodule=fitting.CharDataModule(batch_size=8),
        limit_val_batches=3, val_check_interval=5, num_sanity_val_steps=0,
    )  # fmt: skip
    # validation (2.4 s) outlasts min_timeout_s, the save (10 s) the step's allowance (3 s)
    assert trainer.global_step == 5 and exits == []


def _gloo_timeout_s() -> float:
    backend = torch.distributed.group.WORLD._get_backend(torch.device("cpu"))
    return backend.options._timeout.total_seconds()


def test_the_process_groups_timeout_is_raised_above_the_allowance_and_never_lowered(tiny_trainer_kwargs, caplog):
    """A collective waiting for a hung peer must outlast the peer's allowance, so that the peer reports its stacks."""
    strategy = DDPStrategy(timeout=timedelta(seconds=30))  # one process: the group is this test's
    seen: list[float] = []
    watch = fitting.AtStep(1, lambda trainer: seen.append(_gloo_timeout_s()))
    with caplog.at_level(logging.INFO):
        fitting.fit([HangWatchdog(min_timeout_s=100, startup_timeout_s=200), watch], tiny_trainer_kwargs, 2,
                    strategy=strategy)  # fmt: skip
    assert seen == [200 + COLLECTIVE_MARGIN_S]  # the set-up phase's allowance came first
    assert "the process group's timeout is now 260 s (was 30 s)" in caplog.text

    torch.distributed.destroy_process_group()
    seen.clear()
    fitting.fit([HangWatchdog(min_timeout_s=100, startup_timeout_s=200), watch], tiny_trainer_kwargs, 2,
                strategy=DDPStrategy(timeout=timedelta(hours=2)))  # fmt: skip
    assert seen == [7200]


class SlowFirstStep(CharTransformer):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 0:
            CLOCK.seconds += 2.0  # warm-up: a first backward, compilation
        return super().training_step(batch, batch_idx)


def test_the_first_steps_warm_up_does_not_lengthen_the_allowance(tiny_trainer_kwargs):
    watchdog = HangWatchdog(min_timeout_s=0.5, step_factor=3.0, startup_timeout_s=20.0)
    watchdog.clock = CLOCK
    allowances: list[float] = []
    fitting.fit([watchdog, fitting.AtStep(4, lambda trainer: allowances.append(watchdog.allowance_s))],
                tiny_trainer_kwargs, 5, model=lambda: SlowFirstStep(vocab_size=64),
                datamodule=fitting.CharDataModule(batch_size=8))  # fmt: skip
    # 3 x the slowest of steps 2-4 (no time on the watchdog's clock), at least 0.5 s; with the 2 s first step, 6 s
    assert allowances == [0.5]
