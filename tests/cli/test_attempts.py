"""A usage error handed from one torchrun attempt to the next: read by the same job's later attempts only."""

from __future__ import annotations

import tempfile

from lightning_scale.cli import attempts
from lightning_scale.restart.supervisor import LAUNCHER_PID_VARIABLE


def test_a_new_agent_with_an_earlier_ones_pid_does_not_read_its_usage_error(tmp_path, monkeypatch):
    """pids are reused and torchrun's run id is ``none`` unless given: the agent's start tells the jobs apart."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv(LAUNCHER_PID_VARIABLE, "4242")
    monkeypatch.setattr(attempts, "process_start", lambda pid: 1000)
    attempts.remember_for_later_attempts("an earlier job's usage error")
    assert attempts.usage_error_of_an_earlier_attempt() == "an earlier job's usage error"  # the same job's next attempt
    monkeypatch.setattr(attempts, "process_start", lambda pid: 2000)  # another agent, given pid 4242 later
    assert attempts.usage_error_of_an_earlier_attempt() is None
