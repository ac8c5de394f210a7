"""``make gpu-check``'s memory-snapshot cycle, run on the CPU: the script a session with a GPU runs works, and its
checks can fail (a resumed run that differs, memory left behind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_snapshot_cycle_ends_bitwise_equal_and_frees_its_memory(tmp_path):
    out, scratch = tmp_path / "gpu_snapshot.json", tmp_path / "tmp"
    scratch.mkdir()
    command = [sys.executable, "-m", "benchmarks.gpu_snapshot", "--device=cpu", "--width=128", f"--out={out}"]
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["bitwise_equal"] is True and result["memory_left"] == []
    assert list(scratch.iterdir()) == []  # its runs' directories are gone too
    assert result["snapshot_seconds_median"] > 0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_every_strategy_runs_at_world_size_1_with_an_async_save_and_its_peak(tmp_path):
    out = tmp_path / "gpu_strategies.json"
    command = [sys.executable, "-m", "benchmarks.gpu_strategies", "--device=cpu", "--d-model=64", f"--out={out}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and set(result["rows"]) == {"ddp", "zero0", "zero1", "zero2", "fsdp"}
    for name, row in result["rows"].items():
        assert row["backend"] == "gloo" and row["step_ms"] > 0 and row["peak_mb"] > 0, name
        assert (row["blocked_s"] is not None) == name.startswith("zero"), name
