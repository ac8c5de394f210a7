"""The `make demo` script: preempted, restarted by torchrun, resumed with the banner, bitwise identical, priced."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_scale.report import collect
from lightning_scale.report.wandb_report import panel_keys, report_spec
from tests.report.chromium import render

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_demo_is_preempted_restarted_by_torchrun_and_matches_the_uninterrupted_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "examples/demo.py", f"--workdir={tmp_path}", "--steps=75", "--preempt-after=25"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert re.search(r"Spot reclaim: SIGTERM to rank 1 \(pid \d+\) after the checkpoint at step 25", output)
    preempted = re.search(r"Preemption notice from SIGTERM on rank 1 .* saving a checkpoint at step (\d+)", output)
    resumed = re.search(r"Auto-resuming from \S+step=(\d+)\.ckpt \(global step \d+, epoch \d+, written", output)
    assert preempted and resumed and preempted.group(1) == resumed.group(1), output[-3000:]
    assert 25 <= int(resumed.group(1)) < 75
    summary = output[output.index(">>> Summary") :]
    assert f"  Steps lost: 0 (the previous attempt ended at step {resumed.group(1)})." in summary
    assert re.search(r"  Cost so far: \$\S+, including a restart gap of [\d.]+ s billed as preemption waste\.", summary)
    assert re.search(r"Cost: \$\S+ for 75 steps over [\d.]+ min, .*preemption waste \$", summary)
    assert "Final weights bitwise IDENTICAL to the uninterrupted run." in summary  # of step 75: after the resume
    run = re.search(r"W&B offline run: (\S+)", summary)
    assert run and list(Path(run.group(1)).glob("run-*.wandb")), summary
    assert f"Run report: {tmp_path / 'job' / 'report.html'} (2 attempts" in summary
    _check_the_report_of_the_preempted_run(tmp_path / "job", int(resumed.group(1)), tmp_path)


def _check_the_report_of_the_preempted_run(job: Path, preempted_at: int, tmp_path: Path) -> None:
    """``lightning-scale report`` on the demo's run: its preemption on the timeline and in the cost, read back from
    the run's journal and W&B files, and the page as a real browser renders it (a screenshot kept in
    ``test-artifacts/``)."""
    out = tmp_path / "report.html"
    command = [sys.executable, "-m", "lightning_scale", "report", str(job), f"--out={out}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "2 attempts, status: finished" in done.stdout, done.stdout + done.stderr
    run = collect(job)
    first, second = run.attempts
    assert (first.end_reason, first.end_step, second.start_step, second.end_reason) == (
        "preempted", preempted_at, preempted_at, "finished"
    )  # fmt: skip
    assert [m.step for m in first.marks if m.kind == "preemption"] == [preempted_at]
    assert run.split is not None and run.split.restart_gaps > 0 and run.split.useful > 0
    assert run.loss_key == "train_loss" and len(run.series("train_loss")) >= 5
    rendered = render(out, ROOT / "test-artifacts" / "demo-report.png")
    assert rendered.errors == [], rendered.errors
    assert rendered.dom.count('class="plot"') == 2 and rendered.dom.count('class="series"') >= 2
    assert f"preemption at step {preempted_at}" in rendered.dom and 'class="split"' in rendered.dom
    assert rendered.screenshot.stat().st_size > 10_000
    _check_the_wandb_report_of_the_run(run)


def _check_the_wandb_report_of_the_run(run) -> None:
    """The W&B Report's specification, built offline from the demo's real offline W&B files (nothing is sent): its
    blocks, and every key its panels plot logged by the run, the preemption's included."""
    spec = report_spec("my-team", "lightning-scale-demo", run.logged_keys, run.loss_key, run.monitor_key)
    titles = [getattr(block, "text", None) for block in spec.blocks]
    assert "Where the money went" in str(titles) and "Preemptions and restarts" in str(titles), titles
    plotted = panel_keys(spec)
    assert {"cost/usd_total", "cost/hours", "train_loss", "preemption/step", "cost/nodes"} <= plotted, plotted
    assert plotted <= run.logged_keys, plotted - run.logged_keys
