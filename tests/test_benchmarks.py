"""Smoke test: the benchmarks run and write their JSON. Timings are never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str, tmp_path: Path, timeout_s: int) -> dict:
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "benchmarks" / script), "--quick", f"--out={out}"]
    subprocess.run(command, check=True, capture_output=True, timeout=timeout_s)
    return json.loads(out.read_text())


def test_checkpoint_cost_benchmark_runs_quick_and_writes_json(tmp_path):
    result = run_quick("checkpoint_cost.py", tmp_path, 300)
    assert set(result["table"]) == {"none", "stock", "ours"} and result["machine"]["torch"]


def test_checkpoint_async_benchmark_runs_quick_and_writes_json(tmp_path):
    result = run_quick("checkpoint_async.py", tmp_path, 300)
    assert set(result["table"]) == {"5", "20"} and result["machine"]["torch"]
    assert {"async_over_sync_blocked", "holds", "sync", "async"} <= set(result["table"]["20"])


def test_resume_time_benchmark_runs_quick_and_writes_json(tmp_path):
    result = run_quick("resume_time.py", tmp_path, 300)
    assert set(result["table"]) == {"fresh", "local", "s3"} and result["machine"]["cores"]


def test_cost_levers_benchmark_runs_quick_and_writes_json(tmp_path):
    result = run_quick("cost_levers.py", tmp_path, 300)
    assert set(result["over_fp32"]) == {"fp32", "bf16-mixed", "small sample (10%)"} and result["machine"]["cpu"]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_preemption_cost_benchmark_runs_quick_and_writes_json(tmp_path):
    result = run_quick("preemption_cost.py", tmp_path, 540)
    assert set(result["step_s"]) == {"none", "vote"} and result["notice_to_durable_s"]["median"] > 0


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_pipeline_throughput_benchmark_runs_quick_and_writes_json(tmp_path):
    rows = run_quick("pipeline_throughput.py", tmp_path, 540)["rows"]
    assert rows and {"raw_s", "ours_s", "bubble_theory", "bubble_measured_ours"} <= set(rows[0])


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_data_parallel_step_benchmark_runs_quick_and_writes_json(tmp_path):
    table = run_quick("data_parallel_step.py", tmp_path, 540)["table"]
    assert set(table) == {"raw", "ddp", "data_parallel"} and table["ddp"]["memory_per_rank"][0]["optimizer"] > 0
