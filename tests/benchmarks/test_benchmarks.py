"""Smoke test: `python -m benchmarks.run --quick` runs every benchmark of the registry (one run for the module: each
benchmark's own process costs a few seconds of imports), and each test checks its benchmark's rows of the summary
JSON; timings are never asserted here (benchmarks live in benchmarks/, never in timed unit tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run
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


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> dict:
    """One ``--quick`` run of every benchmark: its summary JSON and its output (a failed benchmark is named there)."""
    out = tmp_path_factory.mktemp("bench") / "latest.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    return {"latest": json.loads(out.read_text()) if out.exists() else None, "done": done}


def _output_of(done: subprocess.CompletedProcess, name: str) -> str:
    """What the run printed from benchmark ``name``'s start to the next one's, and the run's last lines."""
    part = done.stdout.split(f"\n=== {name}: ", 1)[-1].split("\n=== ", 1)[0]
    return part[-3000:] + done.stderr[-3000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(1560)  # the module's run: 4 to 9 minutes on 2 cores beside other tests
def test_the_quick_run_measures_every_benchmark_and_prints_one_table(quick_run):
    done, latest = quick_run["done"], quick_run["latest"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert latest["quick"] is True and set(latest["results"]) == set(latest["seconds"]) == set(NAMES)
    (record,) = latest["runs"]  # the run every row comes from, with the checkout it measured
    assert {"cpu", "cores", "torch", "lightning"} <= set(record["machine"]) and record["commit"]
    assert record["command"] == "python -m benchmarks.run --quick" and record["benchmarks"] == list(NAMES)
    assert "lightning-scale benchmarks" in done.stdout
    assert len(markdown(latest["summary"]).splitlines()) == len(latest["summary"]) + 2


@pytest.mark.multiprocess
@pytest.mark.timeout(1560)
@pytest.mark.parametrize("name", NAMES)
def test_each_benchmark_runs_quick_through_the_runner_and_gives_its_summary_rows(quick_run, name):
    latest = quick_run["latest"]
    assert latest is not None and name in latest["results"], _output_of(quick_run["done"], name)
    rows = [row for row in latest["summary"] if row["benchmark"] == name]
    assert rows
    assert all(isinstance(row["holds"], bool) for row in rows if row["target"])
    measures = " ".join(row["measure"] for row in rows)
    for named in MEASURES[name]:
        assert named in measures, measures


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_only_replaces_its_benchmarks_rows_and_a_failed_benchmark_costs_its_own_alone(quick_run, tmp_path, monkeypatch):
    """``--only`` after the run above: ``cost_levers`` runs again, ``checkpoint_async``'s process exits 3."""
    out = tmp_path / "latest.json"
    before = quick_run["latest"]
    out.write_text(json.dumps(before))
    real_run = run.subprocess.run

    def failing_checkpoint_async(command, **kwargs):
        failed = "benchmarks.checkpoint_async" in command
        return subprocess.CompletedProcess(command, 3) if failed else real_run(command, **kwargs)

    monkeypatch.setattr(run.subprocess, "run", failing_checkpoint_async)
    monkeypatch.setattr(sys, "argv", ["run", "--quick", f"--out={out}", "--only", "cost_levers", "checkpoint_async"])
    with pytest.raises(SystemExit, match=r"failed, without rows in .*: checkpoint_async \(exit 3\)"):
        run.main()
    after = json.loads(out.read_text())
    assert after["results"]["checkpoint_async"] == before["results"]["checkpoint_async"]  # the last run's, kept
    assert after["seconds"]["cost_levers"] != before["seconds"]["cost_levers"]  # measured again
    assert [r["benchmarks"] for r in after["runs"]] == [[n for n in NAMES if n != "cost_levers"], ["cost_levers"]]
    assert after["runs"][1]["command"] == "python -m benchmarks.run --quick --only cost_levers checkpoint_async"
