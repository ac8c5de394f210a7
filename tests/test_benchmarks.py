"""Smoke test: the benchmarks run and write their JSON. Timings are never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
