"""model_parallel with tensor parallelism from the ``lightning-scale`` command on 2 processes (Lightning's launcher);
bad arguments refused early. The shipped example configs run in tests/test_cli.py (data_parallel there with init args
overridden by flags and bf16-mixed; the registry names there and in tests/multiprocess/test_demo.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_scale.strategies import DataParallelStrategy

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.max_steps=4", "--trainer.logger=false",
          "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0"]  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_lightning_cli_trains_model_parallel_by_class_path_with_tensor_parallelism_and_bf16_mixed(tmp_path):
    args = [
        "--trainer.strategy=lightning_scale.strategies.ModelParallelStrategy",
        "--trainer.strategy.tensor_parallel_size=2",
        "--trainer.precision=bf16-mixed",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "lightning_scale",
        "fit",
        "--model=examples.char_transformer.CharTransformer",
        "--data=examples.char_transformer.CharDataModule",
        *COMMON,
        f"--trainer.default_root_dir={tmp_path}",
        f"--checkpoint.dirpath={tmp_path / 'checkpoints'}",
        "--cost.price_per_hour=1",
    ]
    done = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"zero_stage": 2},
            r"zero_stage=2: data_parallel shards the optimizer state \(1\) or not \(0\).*model_parallel",
        ),
        ({"grad_compression": "int8"}, r"grad_compression='int8' is not one of \['none', 'fp16', 'bf16', 'powersgd'\]"),
        ({"grad_compression": "fp16", "ddp_comm_hook": print}, r"either grad_compression or ddp_comm_hook"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataParallelStrategy(**kwargs)


def test_bad_powersgd_settings_are_refused_at_construction_with_the_argument_to_change():
    with pytest.raises(ValueError, match=r"powersgd_warmup_steps=1 must be >= 2"):
        DataParallelStrategy(grad_compression="powersgd", powersgd_warmup_steps=1)
    with pytest.raises(ValueError, match=r"powersgd_rank=0 must be >= 1"):
        DataParallelStrategy(grad_compression="powersgd", powersgd_rank=0)
