"""pipeline_parallel on 2 CPU processes (torchrun, gloo) against single-process training of the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_scale.testing import assert_same_tensors
from tests.jobs import run_json_job, run_json_jobs
from tests.pipeline.stack_model import StackModel, loader

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

STEPS = 12


def job_config(devices: int, **config) -> dict:
    # the same batches in the same order as one process: no sampler injected (one pipeline replica reads it all)
    return {"steps": STEPS, "devices": devices, "use_distributed_sampler": False, **config}


def run_job(tmp_path: Path, name: str, devices: int = 1, expect_failure: bool = False, **config) -> dict:
    return run_json_job("tests.pipeline.job", tmp_path / name, job_config(devices, **config), devices, expect_failure)


def assert_close(pipeline: dict, reference: dict, rtol: float = 1e-5, steps: int = STEPS) -> None:
    assert len(pipeline["train"]) == len(reference["train"]) == steps
    torch.testing.assert_close(torch.tensor(pipeline["train"]), torch.tensor(reference["train"]), rtol=rtol, atol=0)
    if "predictions" in reference["weights"] and "predictions" not in pipeline["weights"]:
        reference = {**reference, "weights": {k: v for k, v in reference["weights"].items() if k != "predictions"}}
    assert pipeline["weights"].keys() == reference["weights"].keys()  # the unsplit model's names
    for name, tensor in reference["weights"].items():  # relative to each tensor's norm: float32 rounding, nothing more
        relative = float((pipeline["weights"][name] - tensor).norm() / tensor.norm())
        assert relative <= rtol, f"{name}: relative difference {relative:.2e}"


ONE_F_ONE_B = {"schedule": "1f1b", "n_microbatches": 4}
SCHEDULES = {
    "gpipe": {"schedule": "gpipe", "n_microbatches": 4},
    "1f1b": ONE_F_ONE_B,
    "interleaved_1f1b": {"schedule": "interleaved_1f1b", "n_microbatches": 4, "stages_per_rank": 2},
    "interleaved_zero_bubble": {"schedule": "interleaved_zero_bubble", "n_microbatches": 4},
    "zbv_zero_bubble": {"schedule": "zbv_zero_bubble", "n_microbatches": 4},
}
# what each comparison trains, on one process and as a pipeline of two stages
ACCUMULATION = {
    "model": {"adam": True},
    "accumulate_grad_batches": 2,
    "gradient_clip_val": 0.05,  # small enough to clip at every step: the norm must span both stages
    "limit_val_batches": 3,  # 16 + 16 + 8 samples: a ragged last validation batch
    "val_check_interval": 6,
}
RAGGED = {"n": 250, "drop_last": False, "steps": 16}  # 15 batches of 16, then one of 10
BF16 = {"precision": "bf16-mixed"}
META = {"meta_init": True}


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, dict]:
    """The single-process runs the pipelines are compared with, one after another in one launch."""
    runs = {"reference": {"predict": True}, "accumulation": ACCUMULATION, "ragged": RAGGED, "bf16": BF16}
    runs["meta"] = {**META, "pipeline": ONE_F_ONE_B}  # a pipeline of one stage
    runs["tokens"] = {"tokens": True}
    configs = {name: job_config(1, **run) for name, run in runs.items()}
    return run_json_jobs("tests.pipeline.job", tmp_path_factory.mktemp("single"), configs, devices=1)


@pytest.fixture(scope="module")
def reference(single) -> dict:
    return single["reference"]


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory) -> dict[str, dict]:
    """Every two-stage pipeline run these tests compare, one after another in one 2-process launch."""
    runs = {name: {"pipeline": pipeline, "predict": True} for name, pipeline in SCHEDULES.items()}
    dropout = {"pipeline": ONE_F_ONE_B, "model": {"dropout": 0.2}}
    runs |= {
        "dropout-first": dropout,
        "dropout-second": dropout,
        "accumulation": {**ACCUMULATION, "pipeline": ONE_F_ONE_B},
        "ragged": {**RAGGED, "pipeline": {"schedule": "gpipe", "n_microbatches": 2}},
        "bf16": {**BF16, "pipeline": {"n_microbatches": 4}},
        "meta": {**META, "pipeline": ONE_F_ONE_B},
        "module_list": {"module_list": True, "pipeline": {**ONE_F_ONE_B, "module": "blocks"}},
        "tokens": {"tokens": True, "pipeline": ONE_F_ONE_B},
    }
    configs = {name: job_config(2, **run) for name, run in runs.items()}
    return run_json_jobs("tests.pipeline.job", tmp_path_factory.mktemp("two-stages"), configs, devices=2)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_stages_match_single_process_training_and_predict_alike(two_stages, reference, schedule):
    assert_close(two_stages[schedule], reference)  # the weights include the predictions (forward-only, after)


def test_accumulation_norm_clipping_adam_and_validation_match_single_process(two_stages, single):
    result, reference = two_stages["accumulation"], single["accumulation"]
    assert_close(result, reference, steps=2 * STEPS)  # a loss per batch, two batches per optimizer step
    assert result["metrics"]["val_loss"] == pytest.approx(reference["metrics"]["val_loss"], rel=1e-5)


def test_a_ragged_last_batch_runs_when_the_microbatches_divide_it(two_stages, single):
    assert_close(two_stages["ragged"], single["ragged"], steps=16)


def test_a_ragged_last_batch_the_microbatches_do_not_divide_is_refused_with_the_fix(tmp_path):
    with pytest.raises(AssertionError, match=r"n_microbatches=4 does not divide the batch size 10; choose a divisor"):
        run_job(tmp_path, "pipeline", devices=2, pipeline=ONE_F_ONE_B, **RAGGED)


def test_dropout_is_applied_and_reproducible(two_stages, reference):
    first, second = two_stages["dropout-first"], two_stages["dropout-second"]
    assert first["train"] == second["train"]  # the same seed, the same masks
    assert first["train"][1:] != reference["train"][1:]  # dropout changed the training


def test_a_pipeline_size_that_does_not_divide_the_world_is_refused_before_training(tmp_path):
    result = run_job(tmp_path, "bad", devices=2, expect_failure=True, pipeline={"pipeline_size": 3})
    assert "pipeline_size=3 does not divide the world size 2; choose a divisor" in result["log"]


def test_interrupted_and_resumed_pipeline_ends_equal_and_its_checkpoint_loads_into_the_unsplit_model(tmp_path):
    pipeline = ONE_F_ONE_B
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
    assert_same_tensors(resumed["weights"], uninterrupted["weights"], "weights")

    # the newest checkpoint is the unsplit model's: one process reproduces the pipeline's validation loss from it
    newest = max((tmp_path / "b" / "checkpoints").glob("*.ckpt"), key=lambda p: int(p.stem.split("step=")[1]))
    model = StackModel(dropout=0.1)
    model.load_state_dict(torch.load(newest, weights_only=False)["state_dict"], strict=True)
    model.eval()
    with torch.no_grad():
        losses = [(model.pipeline_loss_fn(model(x), y), len(x)) for x, y in loader(16, drop_last=False, n=40)]
    single = float(sum(loss * n for loss, n in losses) / sum(n for _, n in losses))
    assert single == pytest.approx(resumed["metrics"]["val_loss"], rel=1e-6)


@pytest.fixture(scope="module")
def four_process_runs(tmp_path_factory) -> dict[str, dict]:
    """Four stages, then two pipelines of two stages, one after another in one 4-process launch."""
    # two pipelines: Lightning's sampler shards the data per replica (shuffled, seed 0) as it does for DDP's ranks
    two_pipelines = {"schedule": "1f1b", "n_microbatches": 4, "pipeline_size": 2}
    configs = {
        "four-stages": job_config(4, pipeline=ONE_F_ONE_B),
        "two-pipelines": job_config(4, pipeline=two_pipelines, use_distributed_sampler=True, model={"adam": True}),
    }
    return run_json_jobs("tests.pipeline.job", tmp_path_factory.mktemp("four-processes"), configs, devices=4)


@pytest.mark.timeout(400)
def test_two_pipelines_of_two_stages_match_ddp_on_two_processes(tmp_path, four_process_runs):
    ddp = run_job(tmp_path, "ddp", devices=2, strategy="ddp", use_distributed_sampler=True, model={"adam": True})
    assert_close(four_process_runs["two-pipelines"], ddp)  # rank 0's losses: replica 0's shard in both


def test_bf16_mixed_trains_through_the_pipeline_like_one_process(two_stages, single):
    result, reference = two_stages["bf16"], single["bf16"]
    # autocast rounds each microbatch on its own: close, not equal
    torch.testing.assert_close(torch.tensor(result["train"]), torch.tensor(reference["train"]), rtol=2e-2, atol=0)
    assert all(torch.isfinite(t).all() for t in result["weights"].values())


def test_a_spot_notice_on_one_stage_stops_the_pipeline_and_it_resumes_equal(tmp_path):
    pipeline = ONE_F_ONE_B
    config = {"checkpoint_every": 100, "model": {"dropout": 0.1}}
    uninterrupted = run_job(tmp_path / "a", "run", devices=2, pipeline=pipeline, **config)
    stopped = run_job(tmp_path / "b", "run", devices=2, pipeline=pipeline, expect_failure=True, sigterm_at=5, **config)
    # seen at the vote after step 6, read at the next one (votes do not wait on several processes)
    assert "Preempted at step 7" in stopped["log"] and "exitcode  : 143" in stopped["log"]
    resumed = run_job(tmp_path / "b", "run", devices=2, pipeline=pipeline, sigterm_at=5, **config)
    assert resumed["train"] == uninterrupted["train"][7:]  # from the step every stage stopped at, bit for bit
    assert_same_tensors(resumed["weights"], uninterrupted["weights"], "weights")


def test_four_stages_match_single_process_training(four_process_runs, reference):
    assert_close(four_process_runs["four-stages"], reference)


def test_a_module_list_of_blocks_splits_like_a_sequential(two_stages, reference):
    result = two_stages["module_list"]
    renamed = {key.replace("blocks.", "model.", 1): value for key, value in result["weights"].items()}
    assert_close({**result, "weights": renamed}, reference)  # the same network, the same training


def test_an_embedding_first_and_a_head_last_in_the_stack_train_like_one_process(two_stages, single):
    """The layout the refusal of parameters outside the stack recommends: token ids into the first stage."""
    assert_close(two_stages["tokens"], single["tokens"])
    assert "stage 0 on pipeline rank 0: blocks 0..3" in two_stages["tokens"]["log"]  # the embedding's stage


def test_a_model_built_on_the_meta_device_trains_the_same_on_two_stages_as_on_one(two_stages, single):
    # each rank allocated and initialised only its own blocks, the same values either way
    assert_close(two_stages["meta"], single["meta"])
    assert "stage 1 on pipeline rank 1: blocks 4..7" in two_stages["meta"]["log"]  # every stage, not rank 0's alone
