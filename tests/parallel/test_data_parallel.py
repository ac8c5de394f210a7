"""data_parallel on 2 CPU processes (torchrun, gloo) against Lightning's stock ddp on the example transformer."""

from __future__ import annotations

import pytest
import torch

from lightning_scale.checkpoint import CheckpointStore
from lightning_scale.checkpoint.manifest import read_manifest
from lightning_scale.testing import assert_exact_resume
from tests import factories
from tests.jobs import run_json_jobs
from tests.parallel.helpers import STEPS, job_config, relative

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_zero_stage_1_matches_stock_ddp_with_a_shard_of_the_optimizer_state_and_accumulates_without_all_reduce(
    tmp_path, two_processes, stock_ddp, checkpoints
):
    ckpt, zero = checkpoints / "zero", two_processes["zero"]
    assert len(zero["losses"]) == 2 * STEPS and relative(zero["losses"], stock_ddp["losses"]) <= 1e-5
    # accumulating batches make no all-reduce call; the batch that steps reduces once per gradient bucket
    calls = [b - a for a, b in zip([0, *zero["allreduce_calls"]], zero["allreduce_calls"], strict=False)]
    assert calls[0::2] == [0] * STEPS and min(calls[1::2]) >= 1 and len(set(calls[1::2])) == 1
    # optimizer state per rank: ~1/2 of DDP's (ZeRO balances whole parameters), and the two shards make the whole
    ddp_bytes = stock_ddp["memory"][0]["optimizer"]
    shards = [rank["optimizer"] for rank in zero["memory"]]
    assert max(shards) <= 0.6 * ddp_bytes and sum(shards) == ddp_bytes
    # the consolidated state resumes on one process, sharded (zero 1 on a world of 1) or not
    saved = torch.load(ckpt, weights_only=True)["optimizer_states"][0]["state"]
    expected = float(sum(t.double().sum() for per in saved.values() for name, t in per.items() if name != "step"))
    resume = {"steps": STEPS + 1, "resume_from": str(ckpt)}
    runs = {f"zero-{stage}": job_config(1, strategy_kwargs={"zero_stage": stage}, **resume) for stage in (1, 0)}
    for one in run_json_jobs("tests.parallel.job", tmp_path, runs, devices=1).values():
        assert one["restored_state_sum"] == pytest.approx(expected, rel=1e-12)
        assert len(one["losses"]) == 1  # and it trains on


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


def test_zero_stage_1_with_powersgd_resumes_bitwise_equal_from_sharded_checkpoints(tmp_path):
    """ZeRO's consolidated optimizer state and PowerSGD's error feedback, warm start and RNG survive a SIGKILL, saved
    as sharded checkpoints: both ranks write shards (the replicated weights are split between them)."""
    report = assert_exact_resume(
        factories.model,
        factories.data_workers0,
        steps=12,
        interrupt_at=6,
        workdir=tmp_path,
        trainer_kwargs={"limit_val_batches": 0},
        strategy="data_parallel",
        strategy_kwargs={"zero_stage": 1, "grad_compression": "powersgd", "powersgd_warmup_steps": 2},
        checkpoint_kwargs={"sharded": True},
    )
    store = CheckpointStore(str(report.workdir / "interrupted" / "checkpoints"))
    files = read_manifest(store, "epoch=0-step=6.ckpt").files or {}
    assert files["__0_0.distcp"][0] > 0 and files["__1_0.distcp"][0] > 0
