"""Acceptance: data code written as users write it resumes bitwise exactly, with no lightning-scale helper in it.

A pairwise design over (loader kind, shuffling, interruption kind, epoch position): 9 cells cover every pair of those
four dimensions and every value of the others (workers 0 and 2; ``ddp`` and ``data_parallel``; validation;
randomness in ``collate_fn`` and ``worker_init_fn``; augmentation from torch, NumPy and ``random`` in every cell).
Each cell trains ``tests.data.user_code`` on 2 processes (torchrun, gloo) uninterrupted and interrupted-then-resumed;
every cell must end bitwise equal and see the same sample ids per rank per step.

To keep the suite short, cells share launches (``tests.data.matrix_job``): the first launch trains every reference and
the first interrupted cell until its interruption; each next one resumes that cell and runs the next one until its
interruption. SpotPreemption's side is checked too: exit 143, the resume banner at the step after the notice, and no
rank or worker left after any launch.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Literal

import pytest

from lightning_scale.testing import (
    CloudNotices,
    Fault,
    JobConfig,
    ResumeReport,
    job_environment,
    kill_process_tree,
    launch_command,
    launch_environment,
    processes_of_job,
    write_job,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40  # 16 steps per epoch: two and a half epochs


@dataclasses.dataclass(frozen=True)
class Cell:
    loader: str  # torch | stateful
    shuffle: str  # shuffle_true | random_sampler | stateful_distributed
    interruption: str  # kill: SIGKILL after a periodic checkpoint | spot: SpotPreemption notice (SIGTERM to rank 1)
    position: str  # epoch0 | later (epoch 1) | last (an epoch's last batch)
    workers: int
    strategy: Literal["ddp", "data_parallel"]
    val: bool = False
    collate: bool = False
    worker_init: bool = False

    @property
    def name(self) -> str:
        return f"{self.loader}-{self.shuffle}-{self.interruption}-{self.position}-w{self.workers}-{self.strategy}"


# (kill: checkpoint every, killed after the checkpoint at; spot: notice at the start of step, saved two steps on)
POSITIONS = {"epoch0": ((5, 10), 8), "later": ((8, 24), 24), "last": ((16, 16), 30)}

CELLS = [
    Cell("torch", "shuffle_true", "kill", "epoch0", 0, "ddp"),
    Cell("torch", "shuffle_true", "kill", "later", 2, "data_parallel", val=True, worker_init=True),
    Cell("stateful", "shuffle_true", "spot", "last", 2, "ddp", collate=True),
    Cell("torch", "random_sampler", "kill", "epoch0", 2, "ddp", collate=True, worker_init=True),
    Cell("torch", "random_sampler", "spot", "later", 0, "ddp", val=True),
    Cell("stateful", "random_sampler", "kill", "last", 2, "data_parallel", val=True),
    Cell("stateful", "stateful_distributed", "spot", "epoch0", 2, "data_parallel", worker_init=True),
    Cell("stateful", "stateful_distributed", "kill", "later", 0, "ddp", collate=True),
    Cell("torch", "stateful_distributed", "kill", "last", 2, "ddp", val=True),
]


def test_the_design_is_pairwise_over_the_four_dimensions_and_covers_every_value():
    dimensions = ["loader", "shuffle", "interruption", "position"]
    values = {d: {getattr(c, d) for c in CELLS} for d in dimensions}
    for i, a in enumerate(dimensions):
        for b in dimensions[i + 1 :]:
            seen = {(getattr(c, a), getattr(c, b)) for c in CELLS}
            assert len(seen) == len(values[a]) * len(values[b]), (a, b)
    assert {c.workers for c in CELLS} == {0, 2} and {c.strategy for c in CELLS} == {"ddp", "data_parallel"}
    assert all(any(getattr(c, extra) for c in CELLS) for extra in ("val", "collate", "worker_init"))


def cell_config(cell: Cell, interrupted: bool) -> JobConfig:
    (every, killed_at), notice_at = POSITIONS[cell.position]
    val = {"limit_val_batches": 2, "val_check_interval": 8} if cell.val else {"limit_val_batches": 0}
    spot = cell.interruption == "spot"
    return JobConfig(
        model_factory="tests.data.user_code:model",
        datamodule_factory="tests.data.user_code:data",
        steps=STEPS,
        checkpoint_every=100 if spot else every,
        seed=7,
        trainer_kwargs=val,
        strategy=cell.strategy,
        trace_params=False,
        interrupt_at=killed_at if interrupted and not spot else None,
        spot_preemption=CloudNotices() if spot else None,
        faults=(Fault(step=notice_at, rank=1, kind="SIGTERM"),) if spot and interrupted else (),
    )


def write_cells(root: Path, interrupted: bool) -> Path:
    entries = []
    for cell in CELLS:
        out = root / cell.name
        path = write_job(out, cell_config(cell, interrupted))
        entries.append({"config": str(path), "out_dir": str(out), "cell": dataclasses.asdict(cell)})
    listing = root / "cells.json"
    listing.write_text(json.dumps(entries, indent=1))
    return listing


def launch(listing: Path, markers: list[Path], log: Path, timeout_s: float = 400) -> int | str:
    """One torchrun launch of the matrix job: its exit code, or ``"killed"`` when a cell's checkpoint was marked."""
    command = launch_command(["-m", "tests.data.matrix_job", str(listing)], 2)
    env = launch_environment([ROOT], PYTHONFAULTHANDLER="1", **job_environment(listing.parent))
    with open(log, "a") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        try:
            while process.poll() is None:
                if any(marker.exists() for marker in markers):
                    kill_process_tree(process.pid)
                    process.wait()
                    for marker in markers:
                        marker.unlink(missing_ok=True)
                    return "killed"
                if time.monotonic() > deadline:
                    raise AssertionError(f"launch timed out after {timeout_s:.0f} s; log tail:\n{tail(log)}")
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                kill_process_tree(process.pid)
                process.wait()
    return process.returncode


def left_behind(root: Path, grace_s: float = 6.0) -> list[str]:
    """The processes of a finished launch still alive after ``grace_s``, described: a DataLoader worker whose rank
    exited notices within 5 s (torch's ``MP_STATUS_CHECK_INTERVAL``) and exits."""
    deadline = time.monotonic() + grace_s
    while (pids := processes_of_job(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [described for pid in pids if (described := _describe(pid)) is not None]


def _describe(pid: int) -> str | None:
    try:
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return None  # it ended meanwhile
    return f"{pid} (parent {parent}): {command}"


def tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict[str, ResumeReport]:
    root = tmp_path_factory.mktemp("matrix")
    cells = json.loads(write_cells(root / "reference", interrupted=False).read_text())
    cells += json.loads(write_cells(root / "interrupted", interrupted=True).read_text())
    listing = root / "cells.json"  # every reference first (the first launch runs them), then the interrupted cells
    listing.write_text(json.dumps(cells, indent=1))
    log = root / "log.txt"
    markers = [root / "interrupted" / cell.name / "interrupted.marker" for cell in CELLS]
    outcomes = []
    for _ in range(len(CELLS) + 1):  # each launch ends with one interruption, the last one with every cell done
        logged = log.stat().st_size if log.exists() else 0
        outcomes.append(launch(listing, markers, log))
        assert left_behind(root) == [], f"after launch {len(outcomes)}"  # ranks and workers all gone
        if outcomes[-1] == 0:
            break
        this_launch = log.read_text(errors="replace")[logged:]
        # torchrun exits 1 when a rank failed: a rank's SpotPreemption exit (143) is the only failure expected
        expected = outcomes[-1] == "killed" or (outcomes[-1] == 1 and "exitcode  : 143" in this_launch)
        assert expected, f"launch outcomes {outcomes}; this launch's log:\n{this_launch[-12000:]}"
    assert outcomes.count("killed") == sum(c.interruption == "kill" for c in CELLS), outcomes
    text = log.read_text()
    spot = [cell for cell in CELLS if cell.interruption == "spot"]
    assert outcomes.count(1) == len(spot) and text.count("exitcode  : 143") >= len(spot)  # SpotPreemption's exit
    # rank 1's notice, voted on after the step after it and read at the next vote (votes do not wait), stopped both
    # ranks there (the last batch of an epoch for "last"); the restarted job resumed from that step
    for cell in spot:
        saved_at = POSITIONS[cell.position][1] + 2
        assert f"Resumed after a preemption: SIGTERM notice, checkpointed at step {saved_at}" in text, cell.name
    reports = {}
    for cell in CELLS:
        ref, res = root / "reference" / cell.name, root / "interrupted" / cell.name
        reports[cell.name] = ResumeReport.of_jobs(ref, res, devices=2)
    return reports


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
def test_user_code_resumes_bitwise_exactly_and_sees_the_same_samples(matrix, cell):
    report = matrix[cell.name]
    assert report.first_divergence() is None, report.first_divergence()
    for rank in (0, 1):
        reference = [(r["step"], r["sample_ids"]) for r in report.reference[rank]]
        resumed = [(r["step"], r["sample_ids"]) for r in report.resumed[rank]]
        assert resumed == reference and len(reference) == STEPS
    assert report.reference[0][0]["sample_ids"] != report.reference[1][0]["sample_ids"]  # ranks split the data
