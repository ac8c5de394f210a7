"""Acceptance: DataLoader workers of a user's distributed job start safely without a chosen multiprocessing_context,
and workers that never start become a report with their stacks and a non-zero exit within the bound."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from lightning_scale.testing import launch_command, launch_environment

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def run_job(out: Path, config: dict, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"out": str(out), **config}))
    command = launch_command(["-m", "tests.data.worker_start_job", str(out / "config.json")], 2)
    job_env = launch_environment([ROOT], **(env or {}))
    return subprocess.run(command, env=job_env, capture_output=True, text=True, timeout=240)


def test_workers_start_from_a_forkserver_twenty_times_and_more_without_a_hang(tmp_path):
    done = run_job(tmp_path, {"epochs": 12})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pids = {rank: int((tmp_path / f"rank{rank}.pid").read_text()) for rank in (0, 1)}
    starts = [line.split() for line in (tmp_path / "starts.txt").read_text().splitlines()]
    assert len({(rank, epoch) for rank, _, epoch in starts}) == 24  # each rank started its workers in 12 epochs
    assert len(starts) == 48  # two workers each time
    assert all(int(parent) != pids[int(rank)] for rank, parent, _ in starts)  # forked by a forkserver, not the rank


def test_workers_that_never_start_are_reported_with_their_stacks_and_the_job_exits_124_within_the_bound(tmp_path):
    started = time.monotonic()
    done = run_job(tmp_path, {"epochs": 4, "stuck_from_epoch": 2}, {"LIGHTNING_SCALE_WORKER_START_TIMEOUT_S": "10"})
    elapsed = time.monotonic() - started
    log = done.stdout + done.stderr
    assert done.returncode != 0 and "exitcode  : 124" in log, log[-3000:]
    assert "training dataloader(s) of epoch 2: no batch 10 s after its DataLoader workers started" in log
    assert "in never_starts" in log and "in __call__" in log  # the worker's own stack, inside the user's function
    assert elapsed < 90, elapsed  # start-up + two epochs + the 10 s bound + the report, not the 120 s group timeout


def test_a_validation_loader_whose_worker_never_delivers_is_reported_with_its_stack_and_the_job_exits_124(tmp_path):
    """Its worker (started from a forkserver, as training loaders' are: a forked one can deadlock) blocks in
    ``__getitem__`` from the validation after epoch 1 on: the sanity check and the validation after epoch 0 pass,
    that one is reported within the bound instead of waiting for gloo's timeout."""
    started = time.monotonic()
    config = {"epochs": 4, "stuck_validation_from_epoch": 1}
    done = run_job(tmp_path, config, {"LIGHTNING_SCALE_WORKER_START_TIMEOUT_S": "10"})
    elapsed = time.monotonic() - started
    log = done.stdout + done.stderr
    assert done.returncode != 0 and "exitcode  : 124" in log, log[-3000:]
    assert "validation dataloader(s) of epoch 1, step 4: no batch 10 s after its DataLoader workers started" in log
    assert "in never_delivers" in log and "in __getitem__" in log  # the worker's own stack
    reads = [line.split() for line in (tmp_path / "validation_reads.txt").read_text().splitlines()]
    pids = {rank: int((tmp_path / f"rank{rank}.pid").read_text()) for rank in (0, 1)}
    assert {rank for rank, _, _ in reads} == {"0", "1"}  # the sanity check's and epoch 0's validations delivered
    assert all(int(parent) != pids[int(rank)] for rank, _, parent in reads)  # forked by a forkserver, not the rank
    assert elapsed < 90, elapsed  # start-up + two epochs + the 10 s bound + the report, not the 120 s group timeout
