"""Where the Slurm tests cannot run, they say why: a skip with the reason, a failure under ``CI=true``."""

from __future__ import annotations

import os

import pytest

from tests.slurm import cluster
from tests.slurm.conftest import skip_or_fail


def test_without_root_the_reason_names_the_user(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cluster.unusable_reason() == (
        "the test cluster runs its daemons as root (SlurmUser=root); this process runs as uid 1000"
    )


def test_without_the_commands_or_apt_get_the_reason_names_both(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "find_command", lambda name: None)
    reason = cluster.unusable_reason()
    assert reason is not None and reason.startswith("munged, mungekey, slurmctld, slurmd, sbatch, srun")
    assert reason.endswith("not installed, and no apt-get to install slurmctld slurmd slurm-client munge")


@pytest.mark.parametrize("ci", ["", "false", "true", "TRUE"])
def test_a_skip_is_a_failure_under_ci(ci):
    failing = ci.lower() == "true"
    with pytest.raises(pytest.fail.Exception if failing else pytest.skip.Exception) as raised:
        skip_or_fail("no apt-get", {"CI": ci})
    expected = "CI=true, and the Slurm tests cannot run: no apt-get" if failing else "no Slurm cluster: no apt-get"
    assert str(raised.value) == expected
