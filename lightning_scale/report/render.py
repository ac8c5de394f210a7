"""The run report as one self-contained HTML file: inline CSS and SVG, no script, nothing fetched to open it."""

from __future__ import annotations

import datetime
from html import escape

from lightning_scale.report.records import Attempt, RunRecord
from lightning_scale.report.svg import Bar, Line, Mark, line_chart, stacked_bar, timeline

__all__ = ["render_html"]

COLORS = {"loss": "#1f77b4", "monitor": "#d62728"}
REASON_COLORS = {
    "finished": "#2ca02c",
    "preempted": "#ff7f0e",
    "hang": "#9467bd",
    "usage_error": "#7f7f7f",
    "failed": "#d62728",
    "running": "#17becf",
}
MARK_COLORS = {"checkpoint": "#555555", "preemption": "#ff7f0e", "hang": "#9467bd"}
SPLIT_COLORS = ["#2ca02c", "#d62728", "#ff7f0e", "#8c564b", "#bcbd22", "#9467bd"]

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 760px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; } td, th { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 6px 12px; }
.card b { display: block; font-size: 1.3em; } svg text { font-size: 11px; fill: #444; } .note { color: #666; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
"""


def _usd(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.6f}"


def _when(unix: float | None) -> str:
    if unix is None:
        return "?"
    return datetime.datetime.fromtimestamp(unix).strftime("%Y-%m-%d %H:%M:%S")


def _card(label: str, value: str) -> str:
    return f'<div class="card">{escape(label)}<b>{escape(value)}</b></div>'


def _summary(record: RunRecord) -> str:
    preemptions = sum(1 for a in record.attempts for m in a.marks if m.kind == "preemption")
    hangs = sum(1 for a in record.attempts if a.hung)  # every rank that waited for the hung one may say so too
    steps = max(
        [a.end_step or 0 for a in record.attempts] + [int(r.get("trainer/global_step", 0)) for r in record.rows],
        default=0,
    )
    hours = record.last("cost/hours")
    return (
        '<div class="cards">'
        + "".join(
            [
                _card("status", record.status),
                _card("cost", _usd(record.last("cost/usd_total"))),
                _card("hours billed", "unknown" if hours is None else f"{hours:.3g}"),
                _card("steps reached", str(steps)),
                _card("attempts", str(len(record.attempts))),
                _card("preemptions", str(preemptions)),
                _card("hangs", str(hangs)),
                _card("per step", _usd(record.last("cost/usd_per_step"))),
            ]
        )
        + "</div>"
    )


def _curves(record: RunRecord) -> str:
    if record.loss_key is None:
        return '<p class="note">No loss was logged with the cost: add a CostTracker and a logger.</p>'
    charts = []
    for axis, label in (("cost/usd_total", "dollars spent (USD)"), ("cost/hours", "hours billed")):
        lines = []
        for key, color in ((record.loss_key, COLORS["loss"]), (record.monitor_key, COLORS["monitor"])):
            if key is None:
                continue
            rows = record.series(key)
            lines.append(Line(key, [float(r[axis]) for r in rows], [float(r[key]) for r in rows], color))
        charts.append(line_chart(lines, label, "value", f"{record.loss_key} against {label}"))
    if not any(record.series(record.loss_key)):
        return '<p class="note">The loss was never logged in the same rows as the cost (CostTracker).</p>'
    return "".join(charts)


def _bars(attempt: Attempt, start: float, previous: Attempt | None) -> list[Bar]:
    bars = []
    if previous is not None and previous.end_unix is not None and attempt.start_unix > previous.end_unix:
        gap = attempt.start_unix - previous.end_unix
        bars.append(Bar(previous.end_unix - start, attempt.start_unix - start, "#999", f"gap {gap:.1f} s", True))
    end = attempt.end_unix if attempt.end_unix is not None else attempt.start_unix
    color = REASON_COLORS.get(attempt.end_reason, "#bbbbbb")
    label = f"steps {attempt.start_step}-{attempt.end_step}, {attempt.seconds:.1f} s, {attempt.end_reason}"
    bars.append(Bar(attempt.start_unix - start, end - start, color, label))
    return bars


def _timeline(record: RunRecord) -> str:
    if not record.attempts:
        return (
            '<p class="note">No journal: the timeline comes from ResumableCheckpoint\'s journal '
            "(<code>journal/</code> in the checkpoint directory), which this run did not write.</p>"
        )
    start = record.attempts[0].start_unix
    end = max((a.end_unix or a.start_unix) for a in record.attempts) - start
    rows = []
    for number, attempt in enumerate(record.attempts):
        previous = record.attempts[number - 1] if number else None
        marks = [
            Mark(m.unix - start, MARK_COLORS.get(m.kind, "#000"), f"{m.kind} at step {m.step}", m.kind != "checkpoint")
            for m in attempt.marks
        ]
        nodes = f" ({int(attempt.nodes)} node{'s' if attempt.nodes != 1 else ''})" if attempt.nodes else ""
        rows.append((f"#{number + 1}{nodes}", _bars(attempt, start, previous), marks))
    table = [
        "<table><tr><th>#</th><th>started</th><th>steps</th><th>seconds</th><th>processes</th><th>nodes</th>"
        "<th>gap before</th><th>ended</th></tr>"
    ]
    for number, attempt in enumerate(record.attempts):
        previous = record.attempts[number - 1] if number else None
        gap = (
            f"{attempt.start_unix - previous.end_unix:.1f} s"
            if previous is not None and previous.end_unix is not None
            else ""
        )
        table.append(
            f"<tr><td>{number + 1}</td><td>{_when(attempt.start_unix)}</td>"
            f'<td class="n">{attempt.start_step}-{attempt.end_step}</td><td class="n">{attempt.seconds:.1f}</td>'
            f'<td class="n">{escape(str(attempt.world_size or ""))}</td>'
            f'<td class="n">{escape(str(attempt.nodes or ""))}</td>'
            f'<td class="n">{gap}</td><td>{escape(attempt.end_reason)}</td></tr>'
        )
    table.append("</table>")
    legend = " ".join(
        f'<span class="swatch" style="background:{color}"></span>{escape(kind)}'
        for kind, color in {**MARK_COLORS, **{"attempt " + k: v for k, v in REASON_COLORS.items()}}.items()
    )
    return timeline(rows, end, "attempts of the job") + f'<p class="note">{legend}</p>' + "".join(table)


def _cost(record: RunRecord) -> str:
    if record.split is None:
        return '<p class="note">No cost was logged: add a CostTracker (the command has one by default).</p>'
    parts = record.split.parts()
    total = record.split.total or 1.0
    rows = "".join(
        f'<tr><td><span class="swatch" style="background:{color}"></span>{escape(label)}</td>'
        f'<td class="n">{_usd(value)}</td><td class="n">{value / total:.1%}</td></tr>'
        for (label, value), color in zip(parts, SPLIT_COLORS, strict=True)
    )
    bar = stacked_bar(
        [(label, value, color) for (label, value), color in zip(parts, SPLIT_COLORS, strict=True)], "cost split"
    )
    return f"{bar}<table><tr><th>where</th><th>USD</th><th>share</th></tr>{rows}</table>"


def render_html(record: RunRecord) -> str:
    """The report of ``record`` as one HTML document."""
    sources = "".join(f"<li><code>{escape(str(p))}</code></li>" for p in record.checkpoint_dirs + record.metric_files)
    advice = "".join(f"<li>{escape(line)}</li>" for line in record.advice) or "<li>No right-sizing metrics.</li>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Run report: {escape(str(record.source))}</title>
<style>{STYLE}</style></head><body>
<h1>Run report: <code>{escape(str(record.source))}</code></h1>
<p class="note">Written by <code>lightning-scale report</code> from the run's own files; last sign of life
{escape(_when(record.last_seen_unix))}.</p>
{_summary(record)}
<h2>Loss against dollars and hours</h2>
{_curves(record)}
<h2>Attempts</h2>
{_timeline(record)}
<h2>Where the money went</h2>
{_cost(record)}
<h2>Right-sizing</h2>
<ul>{advice}</ul>
<h2>Read from</h2>
<ul>{sources}</ul>
</body></html>
"""
