"""Run a test job module (``python -m MODULE CONFIG.json``) on 1 process or under torchrun, and read its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run_json_job(module: str, out: Path, config: dict, devices: int, expect_failure: bool = False) -> dict:
    """Write ``config`` (plus ``out``) to ``out/config.json``, run ``module`` on it, return ``result.json`` with the
    ``weights.pt`` it wrote and the log; with ``expect_failure``, only the log of a run that must fail."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"out": str(out), **config}))
    runner = ["-m", module, str(out / "config.json")]
    if devices > 1:
        runner = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}", *runner]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
    }  # a crash shows where
    done = subprocess.run([sys.executable, *runner], env=env, capture_output=True, text=True, timeout=240)
    if expect_failure:
        assert done.returncode != 0
        return {"log": done.stdout + done.stderr}
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    result["weights"] = torch.load(out / "weights.pt", weights_only=True)
    result["log"] = done.stdout + done.stderr
    return result
