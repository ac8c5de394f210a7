"""Memory snapshots under torchrun: a 2-process job of a user's code (torch ``DataLoader``, ``shuffle=True``, a worker,
dropout, randomness in ``__getitem__``, stock ``ddp``) resumes each failure from the snapshots in node-local shared
memory, newer than its durable checkpoints, and ends bitwise equal to an uninterrupted run; a process killed in the
middle of a snapshot leaves the one before it; finished training leaves nothing in shared memory."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from lightning_scale.testing import Fault, JobConfig, read_traces, run_attempt, write_job

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _config(**changes) -> JobConfig:
    config = JobConfig(
        model_factory="tests.data.user_code:model",
        datamodule_factory="tests.data.user_code:data",
        steps=20,
        checkpoint_every=10,  # the durable checkpoints lag behind: each failure below resumes from memory
        checkpoint_kwargs={"snapshot_every_n_steps": 1},
        trainer_kwargs={"limit_val_batches": 0},
        launch_env={"USER_CELL": '{"loader": "torch", "shuffle": "shuffle_true", "workers": 1}'},
    )
    return dataclasses.replace(config, **changes)


def _first_steps(traces: dict[int, list[dict]]) -> list[int]:
    """The first step each attempt of the job trained (rank 0's records)."""
    firsts: dict[float, int] = {}
    for record in traces[0]:
        firsts.setdefault(record["attempt"], record["step"])
    return [firsts[attempt] for attempt in sorted(firsts)]


def test_every_failure_resumes_from_memory_with_at_most_the_torn_step_replayed(tmp_path, snapshot_root):
    reference = write_job(tmp_path / "reference", _config())
    run_attempt(reference, 120, expect="finish")
    assert list(snapshot_root.iterdir()) == []  # a finished fit removes its snapshots

    faults = (
        Fault(step=4, rank=1, kind="SIGKILL"),  # a lost process: the snapshot of step 4 is in memory
        Fault(step=8, rank=0, kind="crash"),  # an exception in training
        Fault(step=13, rank=1, kind="SIGKILL", save=True),  # killed in the middle of its step-13 snapshot
    )
    job = write_job(
        tmp_path / "faults",
        _config(
            faults=faults,
            max_restarts=3,
            launch_env={**_config().launch_env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
        ),
    )
    run_attempt(job, 240, expect="finish")
    log = (job.parent / "log.txt").read_text(errors="replace")

    resumed = [
        int(step) for step in re.findall(r"Auto-resuming from the memory snapshot of step (\d+) \(on this node\)", log)
    ]
    assert resumed == [4, 8, 12], log[-4000:]  # rank 1's step-13 snapshot was torn: both ranks take step 12's
    assert _first_steps(read_traces(job.parent, 2)) == [1, 5, 9, 13]  # nothing replayed but the torn step
    for rank in (0, 1):
        final = torch.load(job.parent / f"final_rank{rank}.pt", weights_only=True)
        expected = torch.load(reference.parent / f"final_rank{rank}.pt", weights_only=True)
        assert final.keys() == expected.keys() and final
        for name, tensor in expected.items():
            assert torch.equal(final[name], tensor), (rank, name)
    assert list(snapshot_root.iterdir()) == []
