"""The exact-resume harness's job runner: its start-up watchdog dumps the stacks into the log; the job goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_scale.testing.exact_resume import _attempt, _job

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_a_slow_start_dumps_every_thread_of_the_rank_into_the_log_and_training_goes_on(tmp_path):
    config = {
        "model_factory": "tests.factories:model",
        "datamodule_factory": "tests.factories:data_workers0",
        "steps": 2,
        "devices": 1,
        "seed": 0,
        "checkpoint": "resumable",
        "checkpoint_every": 2,
        "trainer_kwargs": {"limit_val_batches": 0},
        "trace_params": False,
        "sys_path": [str(ROOT)],
        "interrupt_at": None,
        "stuck_after_s": 0.01,  # set-up takes longer: the watchdog fires
    }
    _attempt(_job(tmp_path, config), 100, expect="finish")
    log = (tmp_path / "log.txt").read_text()
    assert "STACK DUMP: rank 0 has not started a step after 0 s" in log
    assert log.count("Current thread") >= 1 and "_watch" in log  # this rank's threads, the watchdog among them
