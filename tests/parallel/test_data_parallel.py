"""data_parallel on 2 CPU processes (torchrun, gloo) against Lightning's stock ddp on the example transformer."""

from __future__ import annotations

import pytest
import torch

from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStore, consolidate_checkpoint
from lightning_scale.checkpoint.manifest import read_manifest
from lightning_scale.checkpoint.sharded import load_sharded
from lightning_scale.parallel.data import SHARDS_KEY
from lightning_scale.testing import assert_exact_resume, assert_same_tensors
from tests import factories, fitting
from tests.fitting import FirstStep
from tests.jobs import run_json_jobs
from tests.parallel.helpers import STEPS, job_config, relative

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_matches_stock_ddp_with_a_chunk_of_the_state_and_reduces_as_its_stage_says(
    tmp_path, two_processes, stock_ddp, checkpoints, stage
):
    zero = two_processes["zero" if stage == 1 else "zero2"]
    assert len(zero["losses"]) == 2 * STEPS and relative(zero["losses"], stock_ddp["losses"]) <= 1e-5
    # stage 1: accumulating batches reduce nothing, the batch that steps once per bucket; stage 2: every batch
    calls = [b - a for a, b in zip([0, *zero["allreduce_calls"]], zero["allreduce_calls"], strict=False)]
    assert min(calls[1::2]) >= 1 and len(set(calls[1::2])) == 1
    assert calls[0::2] == ([0] * STEPS if stage == 1 else calls[1::2])
    # held by each rank in the last step, before the optimizer steps: all parameters, but the optimizer state and
    # the reduced gradients of its chunks only (replicated state, or full gradients kept, would fail here)
    ddp = stock_ddp["memory"][0]
    for rank in zero["memory"]:
        assert 0.45 * ddp["optimizer"] <= rank["optimizer"] <= 0.55 * ddp["optimizer"]
        assert 0.45 * ddp["gradients"] <= rank["gradients"] <= 0.55 * ddp["gradients"]
        assert rank["parameters"] == ddp["parameters"]
    if stage == 2:
        return
    # the checkpoint (one file: merged on rank 0) resumes on one process, with ZeRO (a world of 1) or without
    ckpt = checkpoints / "zero"
    saved = torch.load(ckpt, weights_only=True)["optimizer_states"][0]["state"]
    expected = float(sum(t.double().sum() for per in saved.values() for name, t in per.items() if name != "step"))
    resume = {"steps": STEPS + 1, "resume_from": str(ckpt)}
    runs = {f"zero-{stage}": job_config(1, strategy_kwargs={"zero_stage": stage}, **resume) for stage in (2, 0)}
    for one in run_json_jobs("tests.parallel.job", tmp_path, runs, devices=1).values():
        assert one["restored_state_sum"] == pytest.approx(expected, rel=1e-12)
        assert len(one["losses"]) == 1  # and it trains on


def test_zero_clips_gradients_by_their_norm_over_every_rank_as_ddp_does(two_processes, stock_ddp):
    clipped, zero = two_processes["ddp-clip"], two_processes["zero2-clip"]
    assert relative(clipped["losses"][2:], stock_ddp["losses"][2:]) > 1e-4  # clipping changes training here ...
    assert relative(zero["losses"], clipped["losses"]) <= 1e-5  # ... and ZeRO clips as DDP does


def test_fp16_and_powersgd_compression_act_on_cpu_and_stay_close_to_uncompressed(two_processes, stock_ddp):
    fp16, powersgd = two_processes["fp16"], two_processes["powersgd"]
    for compressed in (fp16, powersgd):  # the hook is in effect (Lightning's own ddp_comm_hook is not, on CPU) ...
        assert compressed["weights"]["model.3.out.weight"].ne(stock_ddp["weights"]["model.3.out.weight"]).any()
    assert relative(fp16["losses"], stock_ddp["losses"]) <= 1e-5  # ... and fp16 is close (measured 2e-7)
    assert relative(powersgd["losses"][:4], stock_ddp["losses"][:4]) <= 1e-5  # plain all-reduce while warming up
    assert powersgd["losses"][-1] < powersgd["losses"][0]  # low-rank updates still train


def test_bf16_compression_runs_on_gloo_within_a_looser_tolerance(two_processes, stock_ddp):
    """DDP refuses torch's bf16 hook off NCCL by name; lightning-scale runs the same computation on gloo."""
    bf16 = two_processes["bf16"]
    assert (
        bf16["weights"]["model.3.out.weight"].ne(stock_ddp["weights"]["model.3.out.weight"]).any()
    )  # compressed for real
    assert relative(bf16["losses"], stock_ddp["losses"]) <= 1e-3  # measured 3e-5: bf16 keeps 8 mantissa bits


def test_zero_stage_2_with_bf16_reduction_resumes_bitwise_equal_from_per_rank_chunks_that_also_resume_on_one_process(
    tmp_path, tiny_trainer_kwargs
):
    """Sharded checkpoints by default under ZeRO: each rank writes its own chunks of the optimizer state and its data
    position (``rank_<r>.pt``) with no collective. Killed and re-run on 2 processes: bitwise equal. The last one (an
    epoch's end) also resumes on one process without ZeRO, its chunks merged while loading, exactly as the same
    checkpoint consolidated offline into one file."""
    report = assert_exact_resume(
        factories.model,
        factories.data_workers0,
        steps=8,
        interrupt_at=6,
        checkpoint_every=2,
        workdir=tmp_path / "runs",
        trainer_kwargs={"limit_val_batches": 0, "limit_train_batches": 4},
        strategy="data_parallel",
        strategy_kwargs={"zero_stage": 2, "grad_compression": "bf16"},
    )
    directory = report.workdir / "interrupted" / "checkpoints"
    files = read_manifest(CheckpointStore(str(directory)), "epoch=1-step=8.ckpt").files or {}
    assert {"__0_0.distcp", "__1_0.distcp", "rank_0.pt", "rank_1.pt"} <= set(files)
    saved = load_sharded(str(directory / "epoch=1-step=8.ckpt"))["optimizer_states"][0]
    shares = [saved[SHARDS_KEY][rank]["chunks"] for rank in (0, 1)]
    assert saved["state"] == {}  # nothing merged: each rank its own chunk of every parameter
    every_parameter = set(range(len(saved["param_groups"][0]["params"])))
    assert set(shares[0]) == set(shares[1]) == every_parameter
    assert all(shares[0][i]["start"] == 0 < shares[1][i]["start"] for i in every_parameter)

    def one_more_step(**checkpoint) -> dict[str, torch.Tensor]:
        first = FirstStep()
        trainer = fitting.fit(
            [ResumableCheckpoint(every_n_train_steps=100, **checkpoint), first], tiny_trainer_kwargs, 9,
            model=factories.model, datamodule=factories.data_workers0(), limit_train_batches=4,
        )  # fmt: skip
        assert first.first_step == 8
        return trainer.lightning_module.state_dict()

    merged_while_loading = one_more_step(dirpath=str(directory))
    (tmp_path / "one").mkdir()
    consolidate_checkpoint(directory / "epoch=1-step=8.ckpt", tmp_path / "one" / "one.ckpt")
    consolidated = one_more_step(dirpath=str(tmp_path / "one"))
    assert_same_tensors(merged_while_loading, consolidated, "weights")
