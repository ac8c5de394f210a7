"""The package type-checks: mypy as ``pyproject.toml`` configures it (``make lint`` runs it alone). A test, so that its
~25 s of CPU on a clean clone overlaps the suite's waiting instead of delaying the suite's start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_the_package_type_checks_with_mypy():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "Success: no issues found" in done.stdout
