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


def assert_close(pipeline: dict, reference: dict, rtol: float = 1e-5) -> None:
    assert len(pipeline["train"]) == len(reference["train"]) == STEPS
    torch.testing.assert_close(torch.tensor(pipeline["train"]), torch.tensor(reference["train"]), rtol=rtol, atol=0)
    assert pipeline["weights"].keys() == reference["weights"].keys()  # the unsplit model's names
    for name, tensor in reference["weights"].items():
        torch.testing.assert_close(pipeline["weights"][name], tensor, rtol=rtol, atol=1e-7, msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return run_job(tmp_path_factory.mktemp("reference"), "single")


@pytest.mark.parametrize(
    "pipeline",
    [
        {"schedule": "gpipe", "n_microbatches": 4},
        {"schedule": "1f1b", "n_microbatches": 4},
        {"schedule": "interleaved_1f1b", "n_microbatches": 4, "stages_per_rank": 2},
    ],
    ids=lambda p: p["schedule"],
)
def test_two_stages_match_single_process_training(tmp_path, reference, pipeline):
    result = run_job(tmp_path, "pipeline", devices=2, pipeline=pipeline)
    assert_close(result, reference)
