"""A hang becomes a restart under torchrun: one 2-process job meets every kind of hang the watchdog is for, one
after another (a DataLoader worker blocked before the first step, a worker blocked mid-epoch, a frozen rank, a rank
stuck in ``training_step``), each detected within its allowance with stacks in the log, restarted by torchrun and
resumed; then a slow step, a long validation and a long save are not killed, and the job ends bitwise equal to an
uninterrupted run of the same user code."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path

import pytest
import torch

from lightning_scale.health.watchdog import HANG_EXIT_CODE
from lightning_scale.report import collect
from lightning_scale.testing import Fault, JobConfig, read_traces, run_attempt, torchrun_failures, write_job
from lightning_scale.testing.job import CHECKPOINTS

MIN_TIMEOUT_S = 5.0  # steps of ~20 ms (times step_factor 5): the allowance between training marks is this minimum
STARTUP_TIMEOUT_S = 12.0
DETECTION_SLACK_S = 4.0  # from the allowance's end to torchrun seeing the exit

HANGS = {  # in the order they happen: what hangs, the phases either rank may name first, and the allowance
    "HANG_WORKER=1:1": (
        ("epoch 0, waiting for its first batch", "training step 1 (epoch 0, batch 0)"),
        STARTUP_TIMEOUT_S,
    ),
    "HANG_WORKER=0:25": (  # the 7th batch of an attempt, which rank 0 waits for after step 6: resumed from step 6
        ("after training step 6 (callbacks, then the next batch)", "training step 7 (epoch 0, batch 6)"),
        MIN_TIMEOUT_S,
    ),
    "fault0_rank1.happened": (("training step 9 (epoch 0, batch 8)",), MIN_TIMEOUT_S),  # rank 1 frozen: rank 0 reports
    "HANG_STEP=0:11": (("training step 11 (epoch 0, batch 10)",), MIN_TIMEOUT_S),
}


def _config(tmp_path: Path, **changes) -> JobConfig:
    config = JobConfig(
        model_factory="tests.health.hang_user_code:StallingMLP",
        datamodule_factory="tests.health.hang_user_code:WorkerData",
        steps=20,  # 16 steps per epoch: the job crosses an epoch's end
        checkpoint_every=2,
        trainer_kwargs={"limit_val_batches": 2, "num_sanity_val_steps": 0},
        launch_env={"HANG_CLAIMS": str(tmp_path / "claims")},
    )
    return dataclasses.replace(config, **changes)


@pytest.mark.multiprocess
@pytest.mark.timeout(420)
def test_every_kind_of_hang_is_restarted_and_the_job_ends_bitwise_equal_while_slow_phases_are_not_killed(tmp_path):
    reference = write_job(tmp_path / "reference", _config(tmp_path))
    run_attempt(reference, 120, expect="finish")

    (tmp_path / "claims").mkdir()
    hangs = _config(
        tmp_path,
        max_restarts=4,
        hang_watchdog={"min_timeout_s": MIN_TIMEOUT_S, "step_factor": 5.0, "startup_timeout_s": STARTUP_TIMEOUT_S},
        faults=(
            Fault(step=8, rank=1, kind="SIGSTOP"),  # frozen: killed once rank 0 exits (torchrun would wait 30 s)
            Fault(step=11, rank=1, kind="sleep", seconds=3.0),  # 150 steps long: rank 0 waits in the all-reduce
            Fault(step=12, rank=0, kind="sleep", seconds=7.0, save=True),
            Fault(step=16, rank=0, kind="sleep", seconds=7.0, val_batch=0),  # the validation at the epoch's end
        ),
        launch_env={
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # stock ddp's restarts need it (README: SpotPreemption)
            "HANG_CLAIMS": str(tmp_path / "claims"),
            "HANG_WORKER": "1:1,0:25",  # rank 1's first sample; rank 0's 25th of an attempt
            "HANG_STEP": "0:11",
        },
    )
    job = write_job(tmp_path / "hangs", hangs)
    run_attempt(job, 300, expect="finish")

    log = (job.parent / "log.txt").read_text(errors="replace")
    exits = torchrun_failures(log)
    assert [code for _, code in exits] == [HANG_EXIT_CODE] * len(HANGS), log[-6000:]
    for (phases, allowance), (started, (exited, _)) in zip(HANGS.values(), _hang_starts(tmp_path, job), strict=True):
        assert any(f"in {phase} (worker pids" in log for phase in phases), (phases, log[-6000:])
        # the rank that reports marked its last progress up to a step before or after the hang began
        assert started + datetime.timedelta(seconds=allowance - 1) <= exited, (phases, started, exited)
        assert exited <= started + datetime.timedelta(seconds=allowance + DETECTION_SLACK_S), (phases, started, exited)
    assert log.count("Stacks follow.") >= len(HANGS)
    stopped = re.findall(r"rank 0: processes \[(\d+)\] of its torchrun worker group are stopped", log)
    assert len(stopped) == 1, log[-6000:]  # the frozen rank 1, not left to torchrun's 30 s wait for its SIGTERM
    assert "in _hang_once" in log  # the stuck worker's and the stuck training_step's stacks
    assert "made no progress" not in log.split(f"exitcode: {HANG_EXIT_CODE}")[-1]  # the slow phases were spared
    run = collect(job.parent / CHECKPOINTS)  # the run report's view: every hang on the timeline, then the finish
    assert len(run.attempts) == len(HANGS) + 1 and run.status == "finished", [a.end_reason for a in run.attempts]
    assert [a.end_reason for a in run.attempts[:-1]] == ["hang"] * len(HANGS)

    ref, got = read_traces(reference.parent, 2), read_traces(job.parent, 2)
    for rank in (0, 1):
        expected = {record["step"]: _what_it_did(record) for record in ref[rank]}
        assert sorted({record["step"] for record in got[rank]}) == sorted(expected)
        for record in got[rank]:  # every attempt's every step, replays included
            assert _what_it_did(record) == expected[record["step"]], (rank, record["step"])
    final = torch.load(job.parent / "final_rank0.pt", weights_only=True)
    for name, tensor in torch.load(reference.parent / "final_rank0.pt", weights_only=True).items():
        assert torch.equal(final[name], tensor), name


def _hang_starts(tmp_path: Path, job: Path) -> list[tuple[datetime.datetime, tuple[datetime.datetime, int]]]:
    """When each hang began (its claim or fault record was written), with the attempt's failure it caused."""
    files = [tmp_path / "claims" / name if "=" in name else job.parent / name for name in HANGS]
    starts = [datetime.datetime.fromtimestamp(path.stat().st_mtime) for path in files]
    return list(zip(starts, torchrun_failures((job.parent / "log.txt").read_text(errors="replace")), strict=True))


def _what_it_did(record: dict) -> dict:
    """A trace record without the attempt it came from."""
    return {key: value for key, value in record.items() if key != "attempt"}
