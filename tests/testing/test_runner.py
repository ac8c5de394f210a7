"""The exact-resume harness's job runner: its start-up watchdog dumps the stacks into the log; the job goes on."""

from __future__ import annotations

import pytest

from lightning_scale.testing import JobConfig, run_attempt, write_job


@pytest.mark.timeout(120)
def test_a_slow_start_dumps_every_thread_of_the_rank_into_the_log_and_training_goes_on(tmp_path):
    config = JobConfig(
        model_factory="tests.factories:model",
        datamodule_factory="tests.factories:data_workers0",
        steps=2,
        checkpoint_every=2,
        devices=1,
        trainer_kwargs={"limit_val_batches": 0},
        trace_params=False,
        stuck_after_s=0.01,  # set-up takes longer: the watchdog fires
    )
    run_attempt(write_job(tmp_path, config), 100, expect="finish")
    log = (tmp_path / "log.txt").read_text()
    assert "STACK DUMP: rank 0 has not started a step after 0 s" in log
    assert log.count("Current thread") >= 1 and "_watch" in log  # this rank's threads, the watchdog among them
