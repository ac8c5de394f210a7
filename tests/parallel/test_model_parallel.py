"""model_parallel (FSDP2, tensor parallel) on 2 CPU processes (torchrun, gloo) against Lightning's stock ddp."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy

from examples.char_transformer import CharTransformer
from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.callbacks._checkpoint_format import choose_format
from lightning_scale.checkpoint import consolidate_checkpoint
from lightning_scale.strategies import ModelParallelStrategy
from lightning_scale.testing import assert_same_tensors
from tests.parallel.conftest import FSDP
from tests.parallel.helpers import STEPS, relative, run_job

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def optimizer_state_sum(checkpoint: dict) -> float:
    state = checkpoint["optimizer_states"][0]["state"]
    return float(sum(t.double().sum() for per in state.values() for name, t in per.items() if name != "step"))


def test_fsdp2_matches_stock_ddp_in_half_the_memory_and_its_sharded_checkpoint_resumes_on_one_process(
    tmp_path, two_processes, stock_ddp, checkpoints
):
    ckpt, fsdp = checkpoints / "fsdp", two_processes["fsdp"]
    assert relative(fsdp["losses"], stock_ddp["losses"]) <= 1e-5
    ddp_bytes = sum(stock_ddp["memory"][0].values())  # parameters + gradients + optimizer state, per rank
    assert max(sum(rank.values()) for rank in fsdp["memory"]) <= 0.6 * ddp_bytes
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2  # every rank wrote its own shard
    # one file for one device: the unsplit model's names, loading strictly into the plain module
    consolidated = consolidate_checkpoint(ckpt, tmp_path / "one.ckpt")
    plain = CharTransformer(dropout=0.0)
    plain.load_state_dict(torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"])
    assert_same_tensors(plain.state_dict(), fsdp["weights"], "weights")
    # resharded onto one process: the same optimizer state, and training goes on
    one = run_job(tmp_path, "one", devices=1, strategy="model_parallel", strategy_kwargs=FSDP, steps=STEPS + 1,
                  resume_from=str(ckpt))  # fmt: skip
    assert one["restored_state_sum"] == pytest.approx(optimizer_state_sum(consolidated), rel=1e-12)
    assert len(one["losses"]) == 1


def test_a_one_process_checkpoint_resumes_on_two(tmp_path):
    ckpt = tmp_path / "one.ckpt"
    one = run_job(tmp_path, "one", devices=1, strategy="model_parallel", strategy_kwargs=FSDP, save_to=str(ckpt))
    two = run_job(tmp_path, "two", strategy="model_parallel", strategy_kwargs=FSDP, steps=STEPS + 1,
                  resume_from=str(ckpt))  # fmt: skip
    expected = optimizer_state_sum(consolidate_checkpoint(ckpt, tmp_path / "flat.ckpt"))
    assert two["restored_state_sum"] == pytest.approx(expected, rel=1e-12)
    assert len(one["losses"]) == STEPS and len(two["losses"]) == 1


@pytest.mark.parametrize("model", ["tp-mlps", "tp-mlps-and-attention-heads"])
def test_tensor_parallel_matches_one_process(two_processes, one_process, model):
    """tp=2, dp=1: both ranks hold one model replica, so they read the same batches as one process does."""
    one, tp = one_process[model], two_processes[model]
    if model == "tp-mlps-and-attention-heads":
        assert "model.1.attn.q_proj" in tp["log"] and "model.1.attn.o_proj" in tp["log"]  # the plan, as announced
    assert relative(tp["losses"], one["losses"]) <= 1e-5
    # relative to each tensor's norm: float32 rounding, nothing more (a wrong plan differs by O(1)). The sharded matmuls
    # sum in another order than one process; after AdamW's steps this reached 1.4e-5 for model.1.attn.v_proj.weight on
    # an AMD EPYC host (torch 2.13 CPU), where earlier hosts stayed under 1e-5
    for name, tensor in one["weights"].items():
        ours = tp["weights"][name]
        if name.endswith("attn.in_proj_bias"):
            # the key bias has an exactly-zero gradient (softmax ignores a per-row constant); AdamW turns its float
            # noise into full-size steps, so only the query and value biases can be compared
            d = tensor.numel() // 3
            tensor, ours = torch.cat([tensor[:d], tensor[2 * d :]]), torch.cat([ours[:d], ours[2 * d :]])
        assert float((ours - tensor).norm() / tensor.norm()) <= 5e-5, name


def test_resumable_checkpoint_refuses_a_single_file_of_sharded_state_before_training(tmp_path):
    trainer = Trainer(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(), logger=False)
    checkpoint = ResumableCheckpoint(str(tmp_path), sharded=False)
    with pytest.raises(
        ValueError, match=r"sharded=False\) writes one file, but ModelParallelStrategy shards the state"
    ):
        checkpoint.setup(trainer, CharTransformer(), "fit")


@pytest.mark.parametrize(
    ("async_save", "dirpath", "message"),
    [
        (True, None, r"async_save=True\) writes the shards of strategy='model_parallel' \(FSDP2\) in the background"),
        (False, "memory://run", r"FSDPStrategy loads sharded checkpoints from local disk only"),
    ],
)
def test_lightnings_fsdp1_shards_are_refused_in_the_background_and_on_object_stores(
    tmp_path, async_save, dirpath, message
):
    with pytest.raises(ValueError, match=message):  # FSDPStrategy needs a GPU in a Trainer, not here
        choose_format(FSDPStrategy(state_dict_type="sharded"), None, async_save, dirpath or str(tmp_path), True)


def test_a_tensor_parallel_size_that_does_not_divide_the_world_is_refused_before_training(tmp_path):
    failed = run_job(tmp_path, "tp3", strategy="model_parallel", strategy_kwargs={"tensor_parallel_size": 3},
                     expect_failure=True)  # fmt: skip
    assert "tensor_parallel_size=3 does not divide the world size 2" in failed["log"]
    assert not (tmp_path / "tp3" / "result.json").exists()


def test_a_users_configure_model_wins_over_the_automatic_policy(two_processes, stock_ddp):
    user = two_processes["user"]
    assert "user configure_model ran on rank 0" in user["log"]
    assert "model_parallel: FSDP2 over" not in user["log"]  # the automatic policy stayed out
    assert relative(user["losses"], stock_ddp["losses"]) <= 1e-5
