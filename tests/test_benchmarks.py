"""Smoke test: the benchmarks run and write their JSON. Timings are never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_cost_benchmark_runs_quick_and_writes_json(tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpoint_cost.py"), "--quick", f"--out={out}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert set(result["table"]) == {"none", "stock", "ours"} and result["machine"]["torch"]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_preemption_cost_benchmark_runs_quick_and_writes_json(tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "preemption_cost.py"), "--quick", f"--out={out}"],
        check=True,
        capture_output=True,
        timeout=540,
    )
    result = json.loads(out.read_text())
    assert set(result["step_s"]) == {"none", "vote"} and result["notice_to_durable_s"]["median"] > 0


def test_cost_levers_benchmark_runs_quick_and_writes_json(tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cost_levers.py"), "--quick", f"--out={out}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert set(result["over_fp32"]) == {"fp32", "bf16-mixed", "small sample (10%)"} and result["machine"]["cpu"]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_pipeline_throughput_benchmark_runs_quick_and_writes_json(tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline_throughput.py"), "--quick", f"--out={out}"],
        check=True,
        capture_output=True,
        timeout=540,
    )
    rows = json.loads(out.read_text())["rows"]
    assert rows and {"raw_s", "ours_s", "bubble_theory", "bubble_measured_ours"} <= set(rows[0])
