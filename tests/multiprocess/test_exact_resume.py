"""Acceptance: 2-process CPU DDP (torchrun, gloo), killed with SIGKILL after a checkpoint, resumed by the same command.

The example has 22 batches per rank per epoch (352 training windows, 2 ranks, batch size 8), dropout in the model and
random augmentation in ``__getitem__``; a resumed run must end bitwise identical to an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_scale.checkpoint import CheckpointStore
from lightning_scale.checkpoint.manifest import read_manifest
from lightning_scale.testing import assert_exact_resume, run_interrupted_and_reference
from lightning_scale.testing.processes import descendants
from tests import factories

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

BATCHES_PER_EPOCH = 22
NO_VALIDATION = {"limit_val_batches": 0}


def sample_ids(trace: list[dict]) -> list[list[int]]:
    return [record["sample_ids"] for record in trace]


def test_mid_epoch_resume_with_workers0_is_bitwise_exact_and_sees_the_same_samples(tmp_path):
    report = assert_exact_resume(
        factories.model,
        factories.data_workers0,
        steps=30,
        interrupt_at=12,
        workdir=tmp_path,
        trainer_kwargs=NO_VALIDATION,
    )
    for rank in (0, 1):
        assert sample_ids(report.resumed[rank]) == sample_ids(report.reference[rank])
    assert sample_ids(report.reference[0]) != sample_ids(report.reference[1])  # ranks really see different data
    leftovers = [pid for pid in descendants(1) if str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_text()]
    assert leftovers == []  # the SIGKILLed job left no worker behind


def test_mid_second_epoch_resume_with_workers2_and_augmentation_keeps_that_epochs_order(tmp_path):
    report = assert_exact_resume(
        factories.model,
        factories.data_workers2,
        steps=BATCHES_PER_EPOCH + 18,
        interrupt_at=BATCHES_PER_EPOCH + 8,
        workdir=tmp_path,
        trainer_kwargs={"val_check_interval": 10, "limit_val_batches": 2},
    )
    resumed = report.resumed[1]
    epoch0 = [r["sample_ids"] for r in resumed if r["epoch"] == 0]
    epoch1 = [r["sample_ids"] for r in resumed if r["epoch"] == 1]
    assert epoch1 != epoch0[: len(epoch1)]  # the resumed epoch 1 does not replay epoch 0's order


def test_asynchronous_sharded_saves_resume_bitwise_exact_with_saves_in_flight_and_validation(tmp_path):
    """Every rank writes its shards on its writer thread (over a gloo group of the writers) while training goes on;
    the SIGTERM-on-rank-0 spot test covers asynchronous single files."""
    report = assert_exact_resume(
        factories.model,
        factories.data_workers2,
        steps=20,
        interrupt_at=12,
        checkpoint_every=4,
        checkpoint_kwargs={"async_save": True, "sharded": True},
        workdir=tmp_path,
        trainer_kwargs={"val_check_interval": 6, "limit_val_batches": 2},
    )
    store = CheckpointStore(str(report.workdir / "interrupted" / "checkpoints"))
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(read_manifest(store, "epoch=0-step=12.ckpt").files or {})


def test_checkpoint_on_the_last_batch_of_an_epoch_resumes_into_the_next_epoch(tmp_path):
    report = assert_exact_resume(
        factories.model,
        factories.data_workers2,
        steps=BATCHES_PER_EPOCH + 8,
        interrupt_at=BATCHES_PER_EPOCH,
        workdir=tmp_path,
        trainer_kwargs=NO_VALIDATION,
    )
    after = [r for r in report.resumed[0] if r["step"] > BATCHES_PER_EPOCH]
    assert len(after) == 8 and {r["epoch"] for r in after} == {1}  # no empty epoch was run


def test_stock_model_checkpoint_diverges_where_ours_is_exact(tmp_path):
    with pytest.raises(AssertionError, match=r"diverged from the uninterrupted one at step 13, rank 0"):
        assert_exact_resume(
            factories.model,
            factories.data_workers0,
            steps=30,
            interrupt_at=12,
            workdir=tmp_path,
            trainer_kwargs=NO_VALIDATION,
            checkpoint="stock",
        )


def test_worker_augmentation_without_worker_rng_is_not_exact(tmp_path):
    report = run_interrupted_and_reference(
        factories.model,
        factories.data_workers2_no_worker_rng,
        steps=30,
        interrupt_at=12,
        workdir=tmp_path,
        trainer_kwargs=NO_VALIDATION,
    )
    assert report.first_divergence() is not None and "step 13" in report.first_divergence()
