"""The typed job of lightning_scale.testing without processes: JSON round trip, argument checks, launch command."""

from __future__ import annotations

import re
import sys

import pytest

from lightning_scale.testing import CloudNotices, CostModel, Fault, JobConfig, launch_command, read_job, write_job
from lightning_scale.testing.launch import TORCHRUN


def job(**changes) -> JobConfig:
    return JobConfig(model_factory="m:model", datamodule_factory="m:data", steps=12, checkpoint_every=4, **changes)


def test_every_field_survives_the_json_file_the_runner_reads(tmp_path):
    config = job(
        interrupt_at=8,
        faults=(Fault(step=5, rank=1, kind="SIGTERM", val_batch=1), Fault(step=7, kind="crash")),
        spot_preemption=CloudNotices(grace_seconds=3.0, azure_base_url="http://127.0.0.1:1"),
        cost=CostModel(price_per_hour=8.0, seconds_per_step=450.0, rank_stretch=0.25),
        budget={"max_cost_usd": 5.0},
        trainer_kwargs={"limit_val_batches": 2},
        launch_env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    )
    assert read_job(write_job(tmp_path / "job", config)) == config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"interrupt_at": 12}, "interrupt_at=12 must be between 0 and steps=12"),
        ({"interrupt_at": 6}, "interrupt_at=6 is not a multiple of checkpoint_every=4"),
        ({"trainer_kwargs": {"max_steps": 3}}, "trainer_kwargs may not set ['max_steps']"),
        ({"budget": {"max_cost_usd": 1.0}}, "budget needs cost"),
    ],
)
def test_a_job_the_runner_cannot_run_is_refused_with_the_argument_to_change(changes, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        job(**changes)


def test_a_fault_kind_is_a_crash_a_hang_a_sleep_or_a_signal_name():
    with pytest.raises(ValueError, match="kind='SIGTREM' is none of 'crash', 'hang', 'sleep' and a signal name"):
        Fault(step=1, kind="SIGTREM")
    with pytest.raises(ValueError, match="whole_job=True needs a signal kind"):
        Fault(step=1, kind="crash", whole_job=True)
    with pytest.raises(ValueError, match=re.escape("seconds=0.0 goes with kind='sleep' only, and must then be > 0")):
        Fault(step=1, kind="sleep")
    with pytest.raises(ValueError, match="seconds=2 goes with kind='sleep' only"):
        Fault(step=1, kind="hang", seconds=2)
    with pytest.raises(ValueError, match="save=True and val_batch are exclusive"):
        Fault(step=1, kind="sleep", seconds=1, save=True, val_batch=0)


def test_the_launch_command_is_torchrun_for_several_processes_and_python_for_one():
    assert launch_command(["-m", "job"], 1, max_restarts=3) == [sys.executable, "-m", "job"]
    two_agents = launch_command(["job.py"], 1, nodes=2, rendezvous_endpoint="127.0.0.1:29500", max_restarts=2)
    assert two_agents[1:] == [
        "-c", TORCHRUN, "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29500",
        "--rdzv-id=lightning-scale", "--nproc-per-node=1", "--max-restarts=2", "job.py",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="nodes=2 needs a rendezvous_endpoint"):
        launch_command(["job.py"], 1, nodes=2)
