"""pipeline_parallel on 2 CPU processes (torchrun, gloo) against single-process training of the same model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def run_job(tmp_path: Path, name: str, devices: int = 1, **config) -> dict:
    out = tmp_path / name
    out.mkdir()
    # the same batches in the same order as one process: no sampler injected (one pipeline replica reads it all)
    config = {"out": str(out), "steps": STEPS, "devices": devices, "use_distributed_sampler": False, **config}
    (out / "config.json").write_text(json.dumps(config))
    runner = ["-m", "tests.pipeline.job", str(out / "config.json")]
    if devices > 1:
        runner = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}", *runner]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *runner], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    result["weights"] = torch.load(out / "weights.pt", weights_only=True)
    result["log"] = done.stdout + done.stderr
    return result


def assert_close(pipeline: dict, reference: dict, rtol: float = 1e-5, steps: int = STEPS) -> None:
    assert len(pipeline["train"]) == len(reference["train"]) == steps
    torch.testing.assert_close(torch.tensor(pipeline["train"]), torch.tensor(reference["train"]), rtol=rtol, atol=0)
    assert pipeline["weights"].keys() == reference["weights"].keys()  # the unsplit model's names
    for name, tensor in reference["weights"].items():  # relative to each tensor's norm: float32 rounding, nothing more
        relative = float((pipeline["weights"][name] - tensor).norm() / tensor.norm())
        assert relative <= rtol, f"{name}: relative difference {relative:.2e}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return run_job(tmp_path_factory.mktemp("reference"), "single")


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
def test_two_stages_match_single_process_training(tmp_path, reference, pipeline):
    result = run_job(tmp_path, "pipeline", devices=2, pipeline=pipeline)
    assert_close(result, reference)


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
