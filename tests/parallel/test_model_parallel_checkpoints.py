"""model_parallel (FSDP2) checkpoints written by every rank straight to an S3-protocol server (moto on 127.0.0.1),
in the background: killed and re-run, preempted with a save in flight, resumed on another world size."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from lightning_scale.checkpoint import CheckpointStore
from lightning_scale.checkpoint.manifest import find_newest_valid, read_manifest
from lightning_scale.checkpoint.sharded import load_sharded
from lightning_scale.testing import Fault, JobConfig, ResumeReport, assert_same_tensors, run_attempt, write_job
from tests.callbacks.test_spot_preemption_jobs import base_config
from tests.parallel.conftest import FSDP
from tests.s3 import s3_job_env

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _job(dirpath: str | None, steps: int, **changes) -> JobConfig:
    """The spot-preemption tests' job under model_parallel, with ``async_save`` checkpoints in ``dirpath``."""
    return base_config(
        steps,
        datamodule_factory="tests.factories:data_workers0",
        strategy="model_parallel",
        strategy_kwargs=FSDP,
        checkpoint_dirpath=dirpath,
        checkpoint_kwargs={"async_save": True},
        **changes,
    )


def _on_s3(config: JobConfig, tmp_path: Path, s3_endpoint: str, dirpath: str) -> JobConfig:
    return dataclasses.replace(config, checkpoint_dirpath=dirpath, launch_env=s3_job_env(s3_endpoint, tmp_path))


STEPS_EVERY_3 = _job(None, 12, checkpoint_every=3, trace_params=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run of ``STEPS_EVERY_3``, checkpointed on local disk."""
    out = tmp_path_factory.mktemp("reference")
    run_attempt(write_job(out, STEPS_EVERY_3), 300, expect="finish")
    return out


def test_killed_and_rerun_from_async_sharded_checkpoints_on_s3_ends_bitwise_equal(
    tmp_path, s3_endpoint, s3_bucket, reference
):
    """SIGKILL once the step-6 checkpoint (every rank's shards, written in the background to S3) is durable, then
    the same command: the same steps, batches and final weights as an uninterrupted run (checkpointed locally)."""
    dirpath = f"s3://{s3_bucket}/run"
    config = _on_s3(STEPS_EVERY_3, tmp_path, s3_endpoint, dirpath)
    interrupted = write_job(tmp_path / "interrupted", dataclasses.replace(config, interrupt_at=6))
    run_attempt(interrupted, 300, expect="marker")
    run_attempt(interrupted, 300, expect="finish")
    report = ResumeReport.of_jobs(reference, interrupted.parent, devices=2)
    assert report.first_divergence() is None
    manifest = read_manifest(CheckpointStore(dirpath), "epoch=0-step=6.ckpt")
    assert manifest.files is not None and {"__0_0.distcp", "__1_0.distcp", "meta.pt"} <= set(manifest.files)
    assert "Auto-resuming from" in (tmp_path / "interrupted" / "log.txt").read_text()


def test_a_spot_notice_with_a_save_in_flight_saves_exits_and_torchrun_restarts_it_to_the_same_end(
    tmp_path, s3_endpoint, s3_bucket, reference
):
    """SIGTERM on rank 1 right after a background save to S3 started: SpotPreemption lets it land, saves a later
    step synchronously on every rank, exits 143; torchrun restarts the workers, which resume to the same end."""
    config = _on_s3(STEPS_EVERY_3, tmp_path, s3_endpoint, f"s3://{s3_bucket}/run")
    faults = (Fault(step=3, rank=1, kind="SIGTERM"),)
    job = write_job(tmp_path / "job", dataclasses.replace(config, faults=faults, max_restarts=1))
    run_attempt(job, 300, expect="finish")
    log = (tmp_path / "job" / "log.txt").read_text()
    # seen at the vote after step 4, read at the next one (votes do not wait on several processes)
    assert "Preempted at step 5 (SIGTERM)" in log and "failed (exitcode: 143)" in log
    assert log.count("Auto-resuming from") == 1
    for rank in (0, 1):
        resumed = torch.load(tmp_path / "job" / f"final_rank{rank}.pt", weights_only=True)
        expected = torch.load(reference / f"final_rank{rank}.pt", weights_only=True)
        assert_same_tensors(resumed, expected, "weights")


def test_a_checkpoint_written_on_two_processes_resumes_on_one_and_on_four_from_s3(tmp_path, s3_endpoint, s3_bucket):
    """Two epochs of 4 steps on 2 processes, checkpointed at the epoch ends; the same job on 1 and on 4 processes
    resumes the step-8 checkpoint, each rank reading its new shard's parts from S3: the weights it restores are the
    checkpoint's, resharded (a run that resumes at its max_steps keeps them as restored)."""
    dirpath = f"s3://{s3_bucket}/run"
    trainer_kwargs = {"limit_val_batches": 0, "limit_train_batches": 4}
    config = _on_s3(_job(None, 8, checkpoint_every=4, trainer_kwargs=trainer_kwargs), tmp_path, s3_endpoint, dirpath)
    run_attempt(write_job(tmp_path / "two", config), 300, expect="finish")
    newest, _ = find_newest_valid(CheckpointStore(dirpath))
    assert newest is not None and newest.global_step == 8
    full = load_sharded(f"{dirpath}/{newest.name}")["state_dict"]

    for devices in (1, 4):
        other = tmp_path / f"on{devices}"
        run_attempt(write_job(other, dataclasses.replace(config, devices=devices, checkpoint_every=100)), 300, "finish")
        assert f"Restored all states from the checkpoint at {dirpath}/{newest.name}" in (other / "log.txt").read_text()
        restored = torch.load(other / "final_rank0.pt", weights_only=True)  # rank 0's shards
        for name, tensor in restored.items():
            assert torch.equal(tensor, full[name][: tensor.shape[0]] if tensor.dim() else full[name]), (devices, name)
