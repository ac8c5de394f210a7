"""Test helpers that users run on their own LightningModule and DataModule."""

from lightning_scale.testing.exact_resume import ResumeReport, assert_exact_resume, run_interrupted_and_reference
from lightning_scale.testing.step_clock import StepClock

__all__ = ["ResumeReport", "StepClock", "assert_exact_resume", "run_interrupted_and_reference"]
