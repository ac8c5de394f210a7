"""The `make demo` script: preempted, restarted by torchrun, resumed with the banner, bitwise identical, priced."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert f"  Steps lost: 0 (the previous attempt reached step {resumed.group(1)})." in summary
    assert re.search(r"  Cost so far: \$\S+, including a restart gap of [\d.]+ s billed as preemption waste\.", summary)
    assert re.search(r"Cost: \$\S+ for 75 steps over [\d.]+ min, .*preemption waste \$", summary)
    assert "Final weights bitwise IDENTICAL to the uninterrupted run." in summary  # of step 75: after the resume
    run = re.search(r"W&B offline run: (\S+)", summary)
    assert run and list(Path(run.group(1)).glob("run-*.wandb")), summary
