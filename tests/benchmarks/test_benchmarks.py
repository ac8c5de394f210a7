"""Smoke test: every benchmark of the registry runs through `python -m benchmarks.run --quick` and gives its rows of
the summary JSON, one test per benchmark; timings are never asserted here (benchmarks live in benchmarks/, never in
timed unit tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.registry import NAMES
from benchmarks.run import markdown, selected

ROOT = Path(__file__).resolve().parents[2]

MEASURES = {  # rows each benchmark's summary must hold (a part of their measure)
    "data_parallel_step": ("data_parallel / ddp", "peak memory per rank in a step, model_parallel (FSDP2) / ddp"),
    "callback_overhead": ("every lightning-scale callback of the command / stock", "2 process(es)"),
    "checkpoint_async": ("async / sync",),
    "preemption_cost": ("durable checkpoint", "SpotPreemption voting"),
    "pipeline_throughput": ("raw torch pipelining", "largest pipeline_parallel stage"),
    "resume_time": ("first training step",),
    "process_start": ("frozen imports / stock",),
    "checkpoint_cost": (),
    "cost_levers": (),
    "data_loading": ("resumable loader",),
    "sharded_checkpoint": ("async / sync", "model_parallel shards", "ZeRO-1 per-rank shares"),
    "hang_watchdog": ("HangWatchdog / none", "restarted job's first step"),
    "goodput": ("goodput at a fault every", "SIGKILL → first resumed step", "memory snapshots auto"),
}


def test_every_registered_benchmark_is_smoke_tested():
    assert set(MEASURES) == set(NAMES) and selected(None) == list(NAMES)  # what `--quick` alone runs


@pytest.mark.multiprocess
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", NAMES)
def test_each_benchmark_runs_quick_through_the_runner_and_gives_its_summary_rows(tmp_path, name):
    out = tmp_path / "latest.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", f"--out={out}", "--only", name],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    latest = json.loads(out.read_text())
    assert set(latest["results"]) == {name} and latest["quick"] is True and set(latest["seconds"]) == {name}
    rows = latest["summary"]
    assert rows and {row["benchmark"] for row in rows} == {name}
    (run,) = latest["runs"]  # the run every row comes from, with the checkout it measured
    assert {"cpu", "cores", "torch", "lightning"} <= set(run["machine"]) and run["commit"]
    assert run["command"] == f"python -m benchmarks.run --quick --only {name}" and run["benchmarks"] == [name]
    assert all(isinstance(row["holds"], bool) for row in rows if row["target"])
    measures = " ".join(row["measure"] for row in rows)
    for named in MEASURES[name]:
        assert named in measures, measures
    assert "lightning-scale benchmarks" in done.stdout
    assert len(markdown(rows).splitlines()) == len(rows) + 2
