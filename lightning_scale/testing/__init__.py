"""Test helpers: check that YOUR LightningModule and DataModule resume exactly, and run training jobs as users run
them (``torchrun``, real processes), with faults injected at a known rank and step."""

from lightning_scale.testing.exact_resume import (
    ResumeReport,
    assert_exact_resume,
    assert_same_final_weights,
    assert_same_tensors,
    read_traces,
    run_interrupted_and_reference,
)
from lightning_scale.testing.faults import Fault, FaultInjector
from lightning_scale.testing.job import CloudNotices, CostModel, JobConfig, read_job, write_job
from lightning_scale.testing.launch import launch_command, launch_environment, run_attempt, torchrun_failures
from lightning_scale.testing.processes import job_environment, kill_process_tree, processes_of_job
from lightning_scale.testing.step_clock import StepClock

__all__ = [
    "CloudNotices",
    "CostModel",
    "Fault",
    "FaultInjector",
    "JobConfig",
    "ResumeReport",
    "StepClock",
    "assert_exact_resume",
    "assert_same_final_weights",
    "assert_same_tensors",
    "job_environment",
    "kill_process_tree",
    "launch_command",
    "launch_environment",
    "processes_of_job",
    "read_job",
    "read_traces",
    "run_attempt",
    "run_interrupted_and_reference",
    "torchrun_failures",
    "write_job",
]
