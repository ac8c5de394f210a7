"""The suite's own guards (``tests/suite_guards.py``): a test function that is not collected, and a skip on CI."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import suite_guards


def _tree(root: Path) -> None:
    (root / "feature").mkdir()
    (root / "test_a.py").write_text("def test_one():\n    pass\n\n\ndef helper():\n    pass\n")
    (root / "feature" / "test_b.py").write_text("def test_two():\n    pass\n\n\ndef test_three():\n    pass\n")
    (root / "models.py").write_text(
        "class Model:\n    def test_step(self):\n        pass\n\n\ndef test_not_a_test():\n"
    )


def test_every_module_level_test_function_of_a_test_file_is_expected(tmp_path):
    _tree(tmp_path)
    assert suite_guards.defined_tests(tmp_path) == {
        ("test_a.py", "test_one"), ("feature/test_b.py", "test_two"), ("feature/test_b.py", "test_three")
    }  # fmt: skip


def test_a_function_no_item_comes_from_is_named_and_parametrized_items_count_once(tmp_path):
    _tree(tmp_path)
    items = [
        SimpleNamespace(path=tmp_path / "test_a.py", originalname="test_one", name="test_one"),
        SimpleNamespace(path=tmp_path / "feature" / "test_b.py", originalname="test_two", name="test_two[x]"),
        SimpleNamespace(path=tmp_path / "feature" / "test_b.py", originalname="test_two", name="test_two[y]"),
        SimpleNamespace(path=tmp_path.parent / "elsewhere.py", originalname="test_three", name="test_three"),
    ]
    assert suite_guards.uncollected(tmp_path, items) == ["feature/test_b.py::test_three"]  # type: ignore[arg-type]


def _report(outcome: str, **extra) -> pytest.TestReport:
    longrepr = ("tests/test_x.py", 3, "Skipped: cannot mount a tmpfs here") if outcome == "skipped" else None
    report = pytest.TestReport("tests/test_x.py::test_x", ("tests/test_x.py", 3, "test_x"), {}, outcome, longrepr,
                               "call")  # fmt: skip
    for key, value in extra.items():
        setattr(report, key, value)
    return report


def test_on_ci_a_skip_fails_with_its_reason_and_expected_failures_and_passes_stay():
    skipped = _report("skipped")
    suite_guards.skip_as_failure(skipped)
    assert skipped.failed and "CI=true, and this test was skipped: Skipped: cannot mount a tmpfs here" in str(
        skipped.longrepr
    )
    expected_failure, passed = _report("skipped", wasxfail="torch: can't steal_bwd_input"), _report("passed")
    suite_guards.skip_as_failure(expected_failure)
    suite_guards.skip_as_failure(passed)
    assert expected_failure.skipped and passed.passed


@pytest.mark.parametrize(("value", "ci"), [("true", True), (" TRUE ", True), ("1", False), ("", False)])
def test_ci_is_true_only_when_it_says_true(value, ci):
    assert suite_guards.on_ci({"CI": value}) is ci
