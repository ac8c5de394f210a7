"""What keeps the suite from passing without testing: every test function it holds is collected in a whole run, and
under ``CI=true`` a skipped test is a failure (CI has every package and permission the suite needs).

``tests/conftest.py`` applies them; ``tests/test_suite_guards.py`` proves them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

_TEST_FUNCTION = re.compile(r"^def (test_\w+)", re.MULTILINE)


def defined_tests(root: Path) -> set[tuple[str, str]]:
    """Every module-level test function of the test files under ``root``: ``(path relative to root, name)``."""
    return {
        (path.relative_to(root).as_posix(), name)
        for path in root.rglob("test_*.py")
        for name in _TEST_FUNCTION.findall(path.read_text())
    }


def uncollected(root: Path, items: Iterable[pytest.Item]) -> list[str]:
    """The test functions under ``root`` that none of ``items`` comes from, as ``path::name``."""
    collected = set()
    for item in items:
        path = Path(item.path)
        if path.is_relative_to(root):
            collected.add((path.relative_to(root).as_posix(), getattr(item, "originalname", item.name)))
    return [f"{path}::{name}" for path, name in sorted(defined_tests(root) - collected)]


def whole_run(config: pytest.Config) -> bool:
    """Whether this run collects the whole suite: its test paths, with no selection by keyword, marker or failure."""
    option = config.option
    selections = ("keyword", "markexpr", "deselect", "ignore", "ignore_glob", "lf")  # lf: with the cache plugin only
    selected = any(getattr(option, name, None) for name in selections)
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and not selected


def on_ci(environ: Mapping[str, str]) -> bool:
    return environ.get("CI", "").strip().lower() == "true"


def skip_as_failure(report: pytest.TestReport) -> None:
    """Turn ``report`` of a skipped test (not an expected failure) into a failure that says why it was skipped."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"CI=true, and this test was skipped: {reason}. On CI every test must run."
