"""The run report without a training job: the journal read back into attempts (a run still going, an attempt that
ended without a word), a self-contained page, and a usage error for a directory that holds no run. The report of a
real preempted and restarted run, opened in a real browser, is tested with the demo (tests/examples/test_demo.py);
hangs on its timeline with the hang restarts (tests/health/test_hang_restarts.py)."""

from __future__ import annotations

import re
import time

import pytest

from lightning_scale.checkpoint import CheckpointStore
from lightning_scale.checkpoint.journal import RunJournal
from lightning_scale.checkpoint.progress import ProgressMarker
from lightning_scale.cli import main
from lightning_scale.report import collect, render_html, write_report
from lightning_scale.report.records import _split


def _journal(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    return store, RunJournal(store)


def test_a_run_that_is_still_going_reads_as_running(tmp_path):
    store, journal = _journal(tmp_path)
    journal.record("start", step=0, world_size=2, nodes=1)
    journal.record("checkpoint", step=25, name="epoch=0-step=25.ckpt", seconds=0.5)
    ProgressMarker(store).record(31)
    run = collect(tmp_path)
    assert run.status == "running" and len(run.attempts) == 1
    [attempt] = run.attempts
    assert (attempt.start_step, attempt.end_step, attempt.world_size, attempt.nodes) == (0, 31, 2, 1)
    assert [m.kind for m in attempt.marks] == ["checkpoint"]
    assert collect(tmp_path, now=time.time() + 3600).status.startswith("ended without a word")


def test_attempts_follow_the_journal_with_their_gaps_and_how_each_ended(tmp_path):
    _, journal = _journal(tmp_path)
    journal.record("start", step=0, world_size=2, nodes=2)
    journal.record("checkpoint", step=50, seconds=1.0)
    time.sleep(0.05)
    journal.record("start", step=50, world_size=1, nodes=1, resumed_from="epoch=0-step=50.ckpt")
    journal.record("preemption", step=70, source="SIGTERM", noticed_on_rank=0, saved=True)
    journal.record("end", step=70, reason="preempted")
    journal.record("start", step=70, world_size=1, nodes=1)
    journal.record("end", step=100, reason="finished")
    run = collect(tmp_path)
    assert [(a.start_step, a.end_step, a.end_reason) for a in run.attempts] == [
        (0, 50, "ended without a word (killed or lost)"),
        (50, 70, "preempted"),
        (70, 100, "finished"),
    ]
    assert run.status == "finished" and run.attempts[1].start_unix > run.attempts[0].end_unix
    page = render_html(run)
    assert page.count('class="span"') == 3 + 2  # three attempts and the gaps before the last two
    assert "preemption at step 70" in page and "(2 nodes)" in page


def test_the_page_is_self_contained_without_script(tmp_path):
    _, journal = _journal(tmp_path)
    journal.record("start", step=0)
    write_report(tmp_path, tmp_path / "out" / "report.html")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert page.startswith("<!DOCTYPE html>") and 'class="timeline"' in page


def test_a_directory_without_a_run_is_a_usage_error_naming_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "holds no checkpoints" in err and "default_root_dir" in err, err


def test_publishing_to_wandb_without_credentials_is_a_usage_error_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    _, journal = _journal(tmp_path)
    journal.record("start", step=0)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path), f"--out={tmp_path / 'r.html'}", "--wandb", "my-team/my-project"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "needs WANDB_API_KEY" in err and not (tmp_path / "r.html").exists(), err


def test_the_cost_split_parts_the_restart_waste_into_replayed_steps_and_gaps(tmp_path):
    _, journal = _journal(tmp_path)
    journal.record("start", step=0)
    journal.record("checkpoint", step=40, seconds=2.0)
    journal.record("start", step=40)  # the first attempt reached step 40 and was killed there: nothing replayed...
    journal.record("checkpoint", step=80, seconds=2.0)
    journal.record("preemption", step=90, source="SIGTERM")  # ...the second reached 90 and resumes at 80: 10 steps
    journal.record("start", step=80)
    journal.record("end", step=100, reason="finished")
    attempts = collect(tmp_path).attempts
    figures = {"cost/usd_total": 10.0, "cost/usd_per_hour": 3600.0, "cost/preemption_waste_usd": 2.0,
               "cost/idle_fraction": 0.5, "cost/usd_per_step": 0.1, "stragglers/usd": 0.5}  # fmt: skip
    split = _split(attempts, figures.get)
    assert split is not None
    # replayed: 10 steps x a step's own cost (0.05); checkpoints: 4 s at $1/s; idle: 5 - 2 - 4 (none left)
    assert (split.replayed, split.restart_gaps, split.checkpoints, split.idle, split.stragglers) == pytest.approx(
        (0.5, 1.5, 4.0, 0.0, 0.5)
    )
    assert split.useful == pytest.approx(3.5) and sum(value for _, value in split.parts()) == pytest.approx(10.0)


def test_a_diverged_loss_and_one_point_still_render(tmp_path):
    from lightning_scale.report.svg import Line, line_chart

    chart = line_chart([Line("loss", [0.0, 1.0, 2.0], [1.0, float("nan"), float("inf")], "#000")], "x", "y", "t")
    assert "nan" not in chart and "inf" not in chart and chart.count("<circle") == 1


def test_a_directory_of_several_runs_is_refused_naming_them(tmp_path, capsys):
    for run in ("job", "uninterrupted"):
        RunJournal(CheckpointStore(str(tmp_path / run / "checkpoints"))).record("start", step=0)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "journals of 2 runs" in err and "pass the directory of one run" in err, err


@pytest.mark.parametrize("taken", ["a-directory", "epoch=0-step=5.ckpt"])
def test_an_out_path_that_is_not_a_report_is_refused_and_left_alone(tmp_path, capsys, taken):
    _, journal = _journal(tmp_path)
    journal.record("start", step=0)
    out = tmp_path / taken
    if taken == "a-directory":
        out.mkdir()
    else:
        out.write_bytes(b"a checkpoint")
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path), f"--out={out}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "exists and is not an HTML report" in err, err
    assert out.is_dir() if taken == "a-directory" else out.read_bytes() == b"a checkpoint"
