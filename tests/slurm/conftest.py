"""The ``slurm_cluster`` fixture: one single-node Slurm cluster for the session's Slurm tests, started by
``tests/slurm/cluster.py`` (which installs Debian's packages first when they are missing)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import NoReturn

import pytest

from tests import suite_guards
from tests.slurm.cluster import SlurmCluster, running_cluster, unusable_reason


def skip_or_fail(reason: str, environ: Mapping[str, str]) -> NoReturn:
    """Skip the Slurm tests for ``reason``; under ``CI=true``, fail them instead."""
    if suite_guards.on_ci(environ):
        pytest.fail(f"CI=true, and the Slurm tests cannot run: {reason}", pytrace=False)
    pytest.skip(f"no Slurm cluster: {reason}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running single-node Slurm cluster, shared by the session's Slurm tests and stopped after the last one, with no
    process of it left behind. The daemons' logs end up in a ``slurm-logs`` folder of pytest's temporary folder.

    Where Slurm cannot run (not root, no apt-get, the install failed) the tests are skipped with the reason; with
    ``CI=true`` that is a failure instead, so that CI cannot pass the Slurm tests by skipping them.
    """
    reason = unusable_reason()
    if reason is not None:
        skip_or_fail(reason, os.environ)
    with running_cluster(keep_logs_in=tmp_path_factory.mktemp("slurm-logs")) as cluster:
        yield cluster
