"""Smoke test: `python -m benchmarks.run --quick` runs every benchmark and writes the summary JSON. Timings are never
asserted here (benchmarks live in benchmarks/, never in timed unit tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.registry import NAMES
from benchmarks.run import markdown

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_every_benchmark_runs_quick_and_the_summary_has_a_row_for_each(tmp_path):
    out = tmp_path / "latest.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    latest = json.loads(out.read_text())
    assert set(latest["results"]) == set(NAMES) and latest["quick"] is True
    assert {row["benchmark"] for row in latest["summary"]} == set(NAMES)
    (run,) = latest["runs"]  # the run every row comes from, with the checkout it measured
    assert {"cpu", "cores", "torch", "lightning"} <= set(run["machine"]) and run["commit"]
    assert run["command"] == "python -m benchmarks.run --quick" and run["benchmarks"] == list(NAMES)
    targets = [row for row in latest["summary"] if row["target"]]
    assert len(targets) >= 7 and all(isinstance(row["holds"], bool) for row in targets)
    measures = " ".join(row["measure"] for row in latest["summary"])
    for named in ("data_parallel / ddp", "every lightning-scale callback of the command / stock", "2 process(es)",
                  "async / sync", "durable checkpoint", "SpotPreemption voting", "raw torch pipelining",
                  "peak memory per rank in a step, model_parallel (FSDP2) / ddp", "largest pipeline_parallel stage",
                  "first training step", "resumable loader", "model_parallel shards", "ZeRO-1 per-rank shares",
                  "HangWatchdog / none", "restarted job's first step", "goodput at a fault every",
                  "SIGKILL → first resumed step", "memory snapshots auto"):  # fmt: skip
        assert named in measures, measures
    assert "lightning-scale benchmarks" in done.stdout
    assert len(markdown(latest["summary"]).splitlines()) == len(latest["summary"]) + 2
