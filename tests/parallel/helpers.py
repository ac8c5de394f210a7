"""Running tests/parallel/job.py on 1 or 2 processes and comparing its losses."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.jobs import run_json_job

STEPS = 8


def job_config(devices: int, **config) -> dict:
    return {"steps": STEPS, "devices": devices, "strategy": "data_parallel", **config}


def run_job(tmp_path: Path, name: str, devices: int = 2, expect_failure: bool = False, **config) -> dict:
    return run_json_job("tests.parallel.job", tmp_path / name, job_config(devices, **config), devices, expect_failure)


def relative(a: list[float], b: list[float]) -> float:
    a_, b_ = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float(((a_ - b_).abs() / b_.abs()).max())
