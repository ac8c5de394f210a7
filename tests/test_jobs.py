"""The shared-launch helper's log split (``tests/jobs.py``): each run's part of a log that several ranks write."""

from __future__ import annotations

import io
import json

from tests.jobs import RUN_MARKER, _run_log, job_configs


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_each_runs_marker_is_one_write_so_another_ranks_line_cannot_split_it(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"runs": {"a": {"out": str(tmp_path / "a")}, "b": {"out": str(tmp_path / "b")}}}))
    stdout = _Writes()
    monkeypatch.setattr("sys.stdout", stdout)
    assert [run["out"] for run in job_configs(str(config))] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert [call for call in stdout.calls if call] == [f"{RUN_MARKER}a\n", f"{RUN_MARKER}b\n"]


def test_a_runs_part_of_the_log_spans_every_ranks_marker_and_ends_at_the_next_run():
    log = f"{RUN_MARKER}a\nfrom a\n{RUN_MARKER}b\nrank 0\n{RUN_MARKER}b\nrank 1\n{RUN_MARKER}c\n{RUN_MARKER}c\n"
    assert _run_log(log, "a") == f"{RUN_MARKER}a\nfrom a\n"
    assert _run_log(log, "b") == f"{RUN_MARKER}b\nrank 0\n{RUN_MARKER}b\nrank 1\n"
    assert _run_log(log, "c") == f"{RUN_MARKER}c\n{RUN_MARKER}c\n"
