"""A NaN loss on ONE rank of a 2-process DDP job (torchrun, gloo): both ranks roll back to the same checkpoint."""

from __future__ import annotations

import pytest
import torch

from lightning_scale.testing import JobConfig, assert_same_tensors, read_traces, run_attempt, write_job

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_nan_on_one_rank_rolls_back_every_rank_and_they_stay_in_sync(tmp_path):
    config = JobConfig(
        model_factory="tests.factories:model_nan_on_rank1_at_step_6",
        datamodule_factory="tests.factories:data_workers0",
        steps=12,
        checkpoint_every=5,
        trainer_kwargs={"limit_val_batches": 0},
        trace_params=False,
        divergence_rollback={},
    )
    job = write_job(tmp_path / "job", config)
    run_attempt(job, 240, expect="finish")
    log = (tmp_path / "job" / "log.txt").read_text()
    assert "Divergence at step 7" in log and "rolled back to the weights and optimizer of step 5" in log
    assert [len(trace) for trace in read_traces(tmp_path / "job", 2).values()] == [12, 12]
    weights = [torch.load(tmp_path / "job" / f"final_rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.isfinite(t).all() for t in weights[0].values())
    assert_same_tensors(weights[0], weights[1], "rank 0 against rank 1")  # the replicas never drifted apart
