"""Acceptance: SIGTERM to one rank of a 2-process DDP job (torchrun, gloo) stops every rank at the same step,
checkpoints, exits 143 with no process left, and the same command resumes at that step, ending bitwise identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.testing.exact_resume import _attempt, _job, _traces
from lightning_scale.testing.processes import descendants

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

BATCHES_PER_EPOCH = 22


def base_config(steps: int) -> dict:
    return {
        "model_factory": "tests.factories:model",
        "datamodule_factory": "tests.factories:data_workers2",
        "steps": steps,
        "devices": 2,
        "seed": 0,
        "checkpoint": "resumable",
        "checkpoint_every": 10,
        "trainer_kwargs": {"limit_val_batches": 0},
        "trace_params": False,
        "sys_path": [str(Path(__file__).resolve().parents[2])],
        "interrupt_at": None,
        "spot_preemption": True,
    }


def processes_mentioning(path: Path) -> list[int]:
    found = []
    for pid in descendants(1):
        try:
            if str(path) in Path(f"/proc/{pid}/cmdline").read_text():
                found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.parametrize(
    ("rank", "step"),
    [(1, 6), (0, BATCHES_PER_EPOCH + 5)],
    ids=["rank1-only-first-epoch", "rank0-second-epoch"],
)
def test_sigterm_to_one_rank_stops_all_saves_exits_143_and_resumes_exactly(tmp_path, rank, step):
    steps = BATCHES_PER_EPOCH + 12
    reference = _job(tmp_path / "reference", base_config(steps))
    _attempt(reference, 300, expect="finish")

    job = _job(tmp_path / "job", {**base_config(steps), "signal_at": {"step": step, "rank": rank}})
    _attempt(job, 300, expect="failure")
    log = (tmp_path / "job" / "log.txt").read_text()
    assert "exitcode  : 143" in log and "Preempted at step" in log
    assert processes_mentioning(tmp_path / "job") == []  # ranks and dataloader workers are all gone
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "job" / "checkpoints")))
    assert manifest is not None and manifest.global_step == step + 1  # the step all ranks agreed on

    _attempt(job, 300, expect="finish")  # the same command again
    traces = _traces(tmp_path / "job", 2)
    reference_traces = _traces(tmp_path / "reference", 2)
    for r in (0, 1):
        assert [rec["step"] for rec in traces[r]] == list(range(1, steps + 1))  # restarted at step + 2, none lost
        assert [rec["batch"] for rec in traces[r]] == [rec["batch"] for rec in reference_traces[r]]
    resumed = torch.load(tmp_path / "job" / "final_rank0.pt", weights_only=True)
    expected = torch.load(tmp_path / "reference" / "final_rank0.pt", weights_only=True)
    assert all(torch.equal(resumed[name], tensor) for name, tensor in expected.items())
