"""Acceptance: 2-process CPU DDP (torchrun, gloo), killed with SIGKILL after a checkpoint, resumed by the same command.

The example has 22 batches per rank per epoch (352 training windows, 2 ranks, batch size 8), dropout in the model and
random augmentation in ``__getitem__``; a resumed run must end bitwise identical to an uninterrupted one. Data code as
users write it (epoch 0, a later epoch, an epoch's last batch, workers or none) is the user-code matrix's
(``test_user_code_matrix.py``); these tests cover the checkpoint formats and the stock-Lightning counter-example.
"""

from __future__ import annotations

import pytest

from lightning_scale.checkpoint import CheckpointStore
from lightning_scale.checkpoint.manifest import read_manifest
from lightning_scale.testing import assert_exact_resume
from tests import factories

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

NO_VALIDATION = {"limit_val_batches": 0}


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
