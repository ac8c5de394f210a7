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


def test_zero_stage_1_with_powersgd_resumes_bitwise_equal_from_per_rank_shares_that_also_resume_on_one_process(
    tmp_path, tiny_trainer_kwargs
):
    """Sharded checkpoints by default under ZeRO-1: each rank writes its own share of the optimizer state, its
    PowerSGD error feedback and its data position (``rank_<r>.pt``) with no consolidation. Killed and re-run on 2
    processes: bitwise equal. The last one (an epoch's end) also resumes on one process without ZeRO or compression,
    its shares merged while loading, exactly as the same checkpoint consolidated offline into one file."""
    report = assert_exact_resume(
        factories.model,
        factories.data_workers0,
        steps=8,
        interrupt_at=6,
        checkpoint_every=2,
        workdir=tmp_path / "runs",
        trainer_kwargs={"limit_val_batches": 0, "limit_train_batches": 4},
        strategy="data_parallel",
        strategy_kwargs={"zero_stage": 1, "grad_compression": "powersgd", "powersgd_warmup_steps": 2},
    )
    directory = report.workdir / "interrupted" / "checkpoints"
    files = read_manifest(CheckpointStore(str(directory)), "epoch=1-step=8.ckpt").files or {}
    assert {"__0_0.distcp", "__1_0.distcp", "rank_0.pt", "rank_1.pt"} <= set(files)
    saved = load_sharded(str(directory / "epoch=1-step=8.ckpt"))["optimizer_states"][0]
    shares = [saved[SHARDS_KEY][rank] for rank in (0, 1)]
    assert saved["state"] == {} and shares[0] and shares[1]  # nothing consolidated; each rank its own parameters
    every_parameter = set(range(len(saved["param_groups"][0]["params"])))
    assert not set(shares[0]) & set(shares[1]) and set(shares[0]) | set(shares[1]) == every_parameter

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
