"""pipeline_parallel on 2 CPU processes (torchrun, gloo) against single-process training of the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.jobs import run_json_job
from tests.pipeline.stack_model import StackModel, loader

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

STEPS = 12


def run_job(tmp_path: Path, name: str, devices: int = 1, expect_failure: bool = False, **config) -> dict:
    # the same batches in the same order as one process: no sampler injected (one pipeline replica reads it all)
    config = {"steps": STEPS, "devices": devices, "use_distributed_sampler": False, **config}
    return run_json_job("tests.pipeline.job", tmp_path / name, config, devices, expect_failure)


def assert_close(pipeline: dict, reference: dict, rtol: float = 1e-5, steps: int = STEPS) -> None:
    assert len(pipeline["train"]) == len(reference["train"]) == steps
    torch.testing.assert_close(torch.tensor(pipeline["train"]), torch.tensor(reference["train"]), rtol=rtol, atol=0)
    if "predictions" in reference["weights"] and "predictions" not in pipeline["weights"]:
        reference = {**reference, "weights": {k: v for k, v in reference["weights"].items() if k != "predictions"}}
    assert pipeline["weights"].keys() == reference["weights"].keys()  # the unsplit model's names
    for name, tensor in reference["weights"].items():  # relative to each tensor's norm: float32 rounding, nothing more
        relative = float((pipeline["weights"][name] - tensor).norm() / tensor.norm())
        assert relative <= rtol, f"{name}: relative difference {relative:.2e}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return run_job(tmp_path_factory.mktemp("reference"), "single", predict=True)


@pytest.mark.parametrize(
    "pipeline",
    [
        {"schedule": "gpipe", "n_microbatches": 4},
        {"schedule": "1f1b", "n_microbatches": 4},
        {"schedule": "interleaved_1f1b", "n_microbatches": 4, "stages_per_rank": 2},
        {"schedule": "interleaved_zero_bubble", "n_microbatches": 4},
        {"schedule": "zbv_zero_bubble", "n_microbatches": 4},
    ],
    ids=lambda p: p["schedule"],
)
def test_two_stages_match_single_process_training_and_predict_alike(tmp_path, reference, pipeline):
    result = run_job(tmp_path, "pipeline", devices=2, pipeline=pipeline, predict=True)
    assert_close(result, reference)  # the weights include the predictions (forward-only after training)


def test_accumulation_norm_clipping_adam_and_validation_match_single_process(tmp_path):
    config = {
        "model": {"adam": True},
        "accumulate_grad_batches": 2,
        "gradient_clip_val": 0.05,  # small enough to clip at every step: the norm must span both stages
        "limit_val_batches": 3,  # 16 + 16 + 8 samples: a ragged last validation batch
        "val_check_interval": 6,
    }
    reference = run_job(tmp_path, "single", **config)
    result = run_job(tmp_path, "pipeline", devices=2, pipeline={"schedule": "1f1b", "n_microbatches": 4}, **config)
    assert_close(result, reference, steps=2 * STEPS)  # a loss per batch, two batches per optimizer step
    assert result["metrics"]["val_loss"] == pytest.approx(reference["metrics"]["val_loss"], rel=1e-5)


def test_a_ragged_last_batch_runs_when_the_microbatches_divide_it(tmp_path):
    config = {"n": 250, "drop_last": False, "steps": 16}  # 15 batches of 16, then one of 10
    reference = run_job(tmp_path, "single", **config)
    result = run_job(tmp_path, "pipeline", devices=2, pipeline={"schedule": "gpipe", "n_microbatches": 2}, **config)
    assert_close(result, reference, steps=16)


def test_a_ragged_last_batch_the_microbatches_do_not_divide_is_refused_with_the_fix(tmp_path):
    config = {"n": 250, "drop_last": False, "steps": 16}
    with pytest.raises(AssertionError, match=r"n_microbatches=4 does not divide the batch size 10; choose a divisor"):
        run_job(tmp_path, "pipeline", devices=2, pipeline={"schedule": "1f1b", "n_microbatches": 4}, **config)


def test_dropout_is_applied_and_reproducible(tmp_path, reference):
    pipeline = {"schedule": "1f1b", "n_microbatches": 4}
    first = run_job(tmp_path, "first", devices=2, pipeline=pipeline, model={"dropout": 0.2})
    second = run_job(tmp_path, "second", devices=2, pipeline=pipeline, model={"dropout": 0.2})
    assert first["train"] == second["train"]  # the same seed, the same masks
    assert first["train"][1:] != reference["train"][1:]  # dropout changed the training


def test_a_pipeline_size_that_does_not_divide_the_world_is_refused_before_training(tmp_path):
    result = run_job(tmp_path, "bad", devices=2, expect_failure=True, pipeline={"pipeline_size": 3})
    assert "pipeline_size=3 does not divide the world size 2; choose a divisor" in result["log"]


def test_interrupted_and_resumed_pipeline_ends_equal_and_its_checkpoint_loads_into_the_unsplit_model(tmp_path):
    pipeline = {"schedule": "1f1b", "n_microbatches": 4}
    config = {
        "checkpoint_every": 4,
        "model": {"dropout": 0.1, "adam": True},
        "limit_val_batches": 3,
        "val_check_interval": 12,
    }
    uninterrupted = run_job(tmp_path / "a", "run", devices=2, pipeline=pipeline, **config)
    crashed = run_job(tmp_path / "b", "run", devices=2, pipeline=pipeline, expect_failure=True, crash_at=6, **config)
    assert "machine lost" in crashed["log"]
    resumed = run_job(tmp_path / "b", "run", devices=2, pipeline=pipeline, crash_at=6, **config)  # the same command
    assert "Auto-resuming from" in resumed["log"]
    assert resumed["train"] == uninterrupted["train"][4:]  # steps 5..12 after the step-4 checkpoint, bit for bit
    assert all(torch.equal(resumed["weights"][k], v) for k, v in uninterrupted["weights"].items())

    # the newest checkpoint is the unsplit model's: one process reproduces the pipeline's validation loss from it
    newest = max((tmp_path / "b" / "checkpoints").glob("*.ckpt"), key=lambda p: int(p.stem.split("step=")[1]))
    model = StackModel(dropout=0.1)
    model.load_state_dict(torch.load(newest, weights_only=False)["state_dict"], strict=True)
    model.eval()
    with torch.no_grad():
        losses = [(model.pipeline_loss_fn(model(x), y), len(x)) for x, y in loader(16, drop_last=False, n=40)]
    single = float(sum(loss * n for loss, n in losses) / sum(n for _, n in losses))
    assert single == pytest.approx(resumed["metrics"]["val_loss"], rel=1e-6)


@pytest.mark.timeout(400)
def test_two_pipelines_of_two_stages_match_ddp_on_two_processes(tmp_path):
    # Lightning's sampler shards the data per replica (shuffled, seed 0) as it does for DDP's ranks
    config = {"use_distributed_sampler": True, "model": {"adam": True}}
    ddp = run_job(tmp_path, "ddp", devices=2, strategy="ddp", **config)
    pipeline = {"schedule": "1f1b", "n_microbatches": 4, "pipeline_size": 2}
    result = run_job(tmp_path, "pipeline", devices=4, pipeline=pipeline, **config)
    assert_close(result, ddp)  # rank 0's losses: replica 0's shard in both


def test_bf16_mixed_trains_through_the_pipeline_like_one_process(tmp_path):
    reference = run_job(tmp_path, "single", precision="bf16-mixed")
    result = run_job(tmp_path, "pipeline", devices=2, pipeline={"n_microbatches": 4}, precision="bf16-mixed")
    # autocast rounds each microbatch on its own: close, not equal
    torch.testing.assert_close(torch.tensor(result["train"]), torch.tensor(reference["train"]), rtol=2e-2, atol=0)
    assert all(torch.isfinite(t).all() for t in result["weights"].values())


def test_a_spot_notice_on_one_stage_stops_the_pipeline_and_it_resumes_equal(tmp_path):
    pipeline = {"schedule": "1f1b", "n_microbatches": 4}
    config = {"checkpoint_every": 100, "model": {"dropout": 0.1}}
    uninterrupted = run_job(tmp_path / "a", "run", devices=2, pipeline=pipeline, **config)
    stopped = run_job(tmp_path / "b", "run", devices=2, pipeline=pipeline, expect_failure=True, sigterm_at=5, **config)
    assert "Preempted at step 6" in stopped["log"] and "exitcode  : 143" in stopped["log"]
    resumed = run_job(tmp_path / "b", "run", devices=2, pipeline=pipeline, sigterm_at=5, **config)
    assert resumed["train"] == uninterrupted["train"][6:]  # from the step every stage stopped at, bit for bit
    assert all(torch.equal(resumed["weights"][k], v) for k, v in uninterrupted["weights"].items())


def test_four_stages_match_single_process_training(tmp_path, reference):
    result = run_job(tmp_path, "pipeline", devices=4, pipeline={"schedule": "1f1b", "n_microbatches": 4})
    assert_close(result, reference)


def test_a_module_list_of_blocks_splits_like_a_sequential(tmp_path, reference):
    pipeline = {"schedule": "1f1b", "n_microbatches": 4, "module": "blocks"}
    result = run_job(tmp_path, "pipeline", devices=2, pipeline=pipeline, module_list=True)
    renamed = {key.replace("blocks.", "model.", 1): value for key, value in result["weights"].items()}
    assert_close({**result, "weights": renamed}, reference)  # the same network, the same training


def test_a_model_built_on_the_meta_device_trains_the_same_on_two_stages_as_on_one(tmp_path):
    one = run_job(tmp_path, "one", pipeline={"schedule": "1f1b", "n_microbatches": 4}, meta_init=True)
    two = run_job(tmp_path, "two", devices=2, pipeline={"schedule": "1f1b", "n_microbatches": 4}, meta_init=True)
    assert_close(two, one)  # each rank allocated and initialised only its own blocks, the same values either way
    assert "stage 1 on pipeline rank 1: blocks 4..7" in two["log"]  # every stage described, not rank 0's alone
