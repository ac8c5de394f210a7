"""The `make demo` script: killed, resumed by the same command, and bitwise identical to an uninterrupted run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_demo_resumes_after_sigkill_and_matches_the_uninterrupted_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "examples/demo.py", f"--workdir={tmp_path}", "--steps=60", "--kill-after=25"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    killed_at = re.search(r"Killed the whole job with SIGKILL after its checkpoint at step (\d+)", output)
    resumed_at = re.search(r"Auto-resuming from \S+step=(\d+)\.ckpt", output)
    assert killed_at and resumed_at and killed_at.group(1) == resumed_at.group(1), output[-3000:]
    assert 25 <= int(resumed_at.group(1)) < 60
    assert "Final weights bitwise IDENTICAL to the uninterrupted run" in output
