"""Warm restarts under torchrun: a 2-process job of a user's code meets a killed process, an exception, a frozen
(SIGSTOPped) process and a rank stuck in its ``training_step``; each time every rank's parent restarts the training
from itself, without torchrun, and the job resumes from memory; a spot notice then ends the job for torchrun to
restart. Every step takes the samples of an uninterrupted run, and the job ends bitwise equal to it. The stuck rank is
found by its peers, which wait for it, within seconds: its own watchdog would wait 5 minutes."""

from __future__ import annotations

import dataclasses
import re

import pytest

from lightning_scale.testing import (
    CloudNotices,
    Fault,
    JobConfig,
    assert_same_final_weights,
    read_traces,
    run_attempt,
    torchrun_failures,
    write_job,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

PEER_TIMEOUT_S = 3.0


def _config(**changes) -> JobConfig:
    config = JobConfig(
        model_factory="tests.health.hang_user_code:StallingMLP",  # torch DataLoader, shuffle=True, a worker
        datamodule_factory="tests.health.hang_user_code:WorkerData",
        steps=16,
        checkpoint_every=8,
        checkpoint_kwargs={"snapshot_every_n_steps": 1},
        trainer_kwargs={"limit_val_batches": 0},
        hang_watchdog={"peer_min_timeout_s": PEER_TIMEOUT_S},  # its own allowance stays 5 minutes
    )
    return dataclasses.replace(config, **changes)


def test_each_failure_is_restarted_by_the_ranks_parents_from_memory_without_torchrun(tmp_path, snapshot_root):
    reference = write_job(tmp_path / "reference", _config())
    run_attempt(reference, 120, expect="finish")

    faults = (
        Fault(step=3, rank=1, kind="SIGKILL"),
        Fault(step=6, rank=0, kind="crash"),
        Fault(step=9, rank=1, kind="SIGSTOP"),  # frozen: nothing but its parent can tell it will never go on
        Fault(step=13, rank=0, kind="SIGTERM"),  # a spot notice: saved at 15, exit 143, torchrun restarts the job
    )
    (tmp_path / "claims").mkdir()
    stuck = {"HANG_CLAIMS": str(tmp_path / "claims"), "HANG_STEP": "1:12"}  # rank 1's training_step of step 12
    job = write_job(
        tmp_path / "warm",
        _config(faults=faults, warm_restarts=4, max_restarts=1, launch_env=stuck, spot_preemption=CloudNotices()),
    )
    run_attempt(job, 240, expect="finish")
    log = (job.parent / "log.txt").read_text(errors="replace")

    assert [code for _, code in torchrun_failures(log)] == [143]  # torchrun restarted the preempted job only
    reasons = re.findall(
        r"lightning-scale: (.*)\. Restarting every rank's training from its parent \(attempt (\d)\)", log
    )
    assert [attempt for _, attempt in reasons] == ["1", "2", "3", "4"], log[-5000:]
    assert "rank 1's training process was killed by SIGKILL" in reasons[0][0]
    assert "rank 0's training process exited with code 1" in reasons[1][0]
    assert "rank 1's training process was stopped by SIGSTOP" in reasons[2][0]
    still = re.search(r"rank 1 made no progress for ([\d.]+) s while the others waited for it", reasons[3][0])
    assert still and float(still.group(1)) >= PEER_TIMEOUT_S, reasons[3][0]
    assert "in _hang_once" in log  # the stuck rank's stacks, printed before it was killed
    resumed = re.findall(r"Auto-resuming from the memory snapshot of step (\d+)", log)
    assert resumed == ["3", "6", "9", "11"]
    firsts: dict[float, int] = {}
    for record in read_traces(job.parent, 2)[0]:
        firsts.setdefault(record["attempt"], record["step"])
    assert [firsts[a] for a in sorted(firsts)] == [1, 4, 7, 10, 12, 16]  # no step replayed
    expected_steps = {
        (r["step"], rank): r for rank, records in read_traces(reference.parent, 2).items() for r in records
    }
    for rank, records in read_traces(job.parent, 2).items():
        for record in records:  # the same samples, batch and loss at every step of every attempt
            same = expected_steps[(record["step"], rank)]
            assert (record["sample_ids"], record["batch"], record["loss"]) == (
                same["sample_ids"],
                same["batch"],
                same["loss"],
            ), (rank, record["step"])
    assert_same_final_weights(job.parent, reference.parent, 2)
    assert list(snapshot_root.iterdir()) == []
