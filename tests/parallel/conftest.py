"""The runs the strategy tests of this package compare, each launch shared: every 2-process run in one launch, the
1-process references in another (a launch costs ~7 s on 2 cores before training; see tests/jobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import run_json_jobs
from tests.parallel.helpers import job_config

FSDP = {"min_params_to_shard": 1000}
POWERSGD = {"grad_compression": "powersgd", "powersgd_rank": 2, "powersgd_warmup_steps": 2}


@pytest.fixture(scope="package")
def checkpoints(tmp_path_factory) -> Path:
    """Where the shared runs save the checkpoints that tests resume elsewhere."""
    return tmp_path_factory.mktemp("saved")


@pytest.fixture(scope="package")
def two_processes(tmp_path_factory, checkpoints) -> dict[str, dict]:
    """Every 2-process comparison run, accumulating 2 batches per step; ``ddp`` is Lightning's stock DDPStrategy."""
    runs = {
        "ddp": {"strategy": "ddp", "contract": True},
        "zero": {"strategy_kwargs": {"zero_stage": 1}, "count_allreduce": True, "save_to": str(checkpoints / "zero"),
                 "contract": True},
        "zero2": {"strategy_kwargs": {"zero_stage": 2}, "count_allreduce": True},
        "ddp-clip": {"strategy": "ddp", "clip": 0.01},
        "zero2-clip": {"strategy_kwargs": {"zero_stage": 2}, "clip": 0.01},
        "fp16": {"strategy_kwargs": {"grad_compression": "fp16"}},
        "powersgd": {"strategy_kwargs": POWERSGD},
        "bf16": {"strategy_kwargs": {"grad_compression": "bf16"}},
        "fsdp": {"strategy": "model_parallel", "strategy_kwargs": FSDP, "save_to": str(checkpoints / "fsdp"),
                 "contract": True},
        "user": {"strategy": "model_parallel", "user_configure_model": True},
        "tp-mlps": {"strategy": "model_parallel", "strategy_kwargs": {"tensor_parallel_size": 2}},
        "tp-mlps-and-attention-heads": {
            "strategy": "model_parallel", "strategy_kwargs": {"tensor_parallel_size": 2}, "linear_attention": True
        },
    }  # fmt: skip
    configs = {name: job_config(2, accumulate=2, **run) for name, run in runs.items()}
    return run_json_jobs("tests.parallel.job", tmp_path_factory.mktemp("two"), configs, devices=2)


@pytest.fixture(scope="package")
def one_process(tmp_path_factory) -> dict[str, dict]:
    """The 1-process runs tensor parallelism (one replica over both ranks) is compared with."""
    runs = {"tp-mlps": {}, "tp-mlps-and-attention-heads": {"linear_attention": True}}
    configs = {name: job_config(1, strategy="ddp", accumulate=2, **run) for name, run in runs.items()}
    return run_json_jobs("tests.parallel.job", tmp_path_factory.mktemp("one"), configs, devices=1)


@pytest.fixture(scope="package")
def stock_ddp(two_processes) -> dict:
    """Lightning's DDPStrategy, accumulating 2 batches per step."""
    return two_processes["ddp"]
