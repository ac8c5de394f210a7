"""What a run left behind, gathered for its report: the journal's attempts, the loggers' metrics, the cost split.

Read from a run directory (Lightning's ``default_root_dir``) or a checkpoint directory: the journal and
``progress.json`` of every checkpoint directory under it, the rows of every Lightning ``metrics.csv`` and of every W&B
run file (``wandb/*/run-*.wandb``, offline or synced). Nothing is written, so a run that is still going can be read.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_scale.checkpoint.journal import JOURNAL_DIR, JournalEvent, RunJournal
from lightning_scale.checkpoint.progress import PROGRESS_NAME
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.cost.rightsizing import GIB, RightSizingReport
from lightning_scale.errors import ConfigurationError
from lightning_scale.report.wandb_offline import history_keys, history_rows, read_records

__all__ = ["Attempt", "CostSplit", "RunRecord", "collect"]

RUNNING_WITHIN_S = 300.0
"""A run whose newest sign of life (progress marker, journal event) is this recent, with no end, is still going."""


@dataclass
class Attempt:
    """One start of the job, from its ``start`` event to its ``end`` (or its last sign of life)."""

    start_unix: float
    start_step: int
    world_size: int | None
    nodes: int | None
    resumed_from: str | None
    end_unix: float | None = None
    end_step: int | None = None
    end_reason: str = "no end recorded"
    marks: list[JournalEvent] = field(default_factory=list)

    @property
    def hung(self) -> bool:
        return any(mark.kind == "hang" for mark in self.marks)

    @property
    def seconds(self) -> float:
        return 0.0 if self.end_unix is None else max(0.0, self.end_unix - self.start_unix)


@dataclass(frozen=True)
class CostSplit:
    """Where the dollars went, in USD; ``useful`` is the rest of ``total``."""

    total: float
    replayed: float
    restart_gaps: float
    checkpoints: float
    idle: float
    stragglers: float

    @property
    def useful(self) -> float:
        return max(0.0, self.total - self.replayed - self.restart_gaps - self.checkpoints - self.idle - self.stragglers)

    def parts(self) -> list[tuple[str, float]]:
        """``(what, USD)``, useful work first."""
        return [
            ("useful training", self.useful),
            ("steps trained again after a failure", self.replayed),
            ("restart gaps (detection, restart, load)", self.restart_gaps),
            ("checkpoint saves (training blocked)", self.checkpoints),
            ("idle: validation, data waits, start-up", self.idle),
            ("waiting for stragglers", self.stragglers),
        ]


@dataclass
class RunRecord:
    """Everything the report shows."""

    source: Path
    checkpoint_dirs: list[Path]
    metric_files: list[Path]
    attempts: list[Attempt]
    rows: list[dict[str, Any]]
    logged_keys: set[str]
    loss_key: str | None
    monitor_key: str | None
    split: CostSplit | None
    advice: list[str]
    status: str
    last_seen_unix: float | None

    def series(self, key: str) -> list[dict[str, Any]]:
        """The rows that hold ``key`` and the cost, in the order they were logged."""
        return [row for row in self.rows if key in row and "cost/usd_total" in row and "cost/hours" in row]

    def last(self, key: str) -> float | None:
        """The last finite value logged under ``key``."""
        values = [row[key] for row in self.rows if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
        return float(values[-1]) if values else None


def _checkpoint_dirs(source: Path) -> list[Path]:
    inside = [p for p in source.rglob("*") if p.is_dir() and "wandb" not in p.relative_to(source).parts]
    candidates = [source, *(p for p in inside if p.name != JOURNAL_DIR)]
    return [
        p
        for p in candidates
        if (p / JOURNAL_DIR).is_dir() or (p / PROGRESS_NAME).is_file() or any(p.glob("*.manifest.json"))
    ]


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(newline="") as handle:
        for raw in csv.DictReader(handle):
            row: dict[str, Any] = {}
            for key, value in raw.items():
                if value in ("", None):
                    continue
                try:
                    row[key] = float(value)
                except ValueError:
                    row[key] = value
            if "step" in row:
                row["trainer/global_step"] = row["step"]
            rows.append(row)
    return rows


def _metric_rows(source: Path) -> tuple[list[Path], list[dict[str, Any]], set[str]]:
    """Rows of the W&B run files (ordered by their time) or, without them, of Lightning's CSV files; and every key
    logged (W&B's tables and media included)."""
    wandb_files = sorted(source.rglob("run-*.wandb"))
    rows: list[dict[str, Any]] = []
    keys: set[str] = set()
    for path in wandb_files:
        try:
            records = read_records(path)
        except Exception:  # an unreadable run file: the others still tell their part
            continue
        rows += history_rows(records)
        keys |= history_keys(records)
    if rows:
        return wandb_files, sorted(rows, key=lambda row: row.get("_timestamp", 0.0)), keys
    csv_files = sorted(source.rglob("metrics.csv"), key=lambda p: (p.stat().st_mtime, str(p)))
    for path in csv_files:
        rows += _csv_rows(path)
    return csv_files, rows, {key for row in rows for key in row}


def _attempts(events: list[JournalEvent]) -> list[Attempt]:
    attempts: list[Attempt] = []
    for event in events:
        if event.kind == "start":
            details = event.details
            attempts.append(
                Attempt(
                    event.unix, event.step, details.get("world_size"), details.get("nodes"), details.get("resumed_from")
                )
            )
            attempts[-1].end_step = event.step
            continue
        if not attempts:
            continue
        current = attempts[-1]
        if event.kind == "end":
            if current.end_reason not in ("hang", "preempted"):  # the cause, not the error its peers then saw
                current.end_reason = str(event.details.get("reason", "ended"))
        else:
            current.marks.append(event)
            if event.kind in ("hang", "preemption"):
                current.end_reason = "hang" if event.kind == "hang" else "preempted"
        current.end_unix = max(current.end_unix or event.unix, event.unix)
        current.end_step = max(current.end_step or event.step, event.step)
    return attempts


def _split(attempts: list[Attempt], last: Any) -> CostSplit | None:
    """Where the dollars went, from the last logged cost figures: the restart gaps billed as preemption waste split
    into the steps trained again (the steps each attempt reached beyond the next one's start, at a step's own cost)
    and the rest; saves at the time training was blocked; idle time beside those; stragglers' waits."""
    total = last("cost/usd_total")
    if total is None:
        return None
    usd_per_hour = last("cost/usd_per_hour") or 0.0
    waste = last("cost/preemption_waste_usd") or 0.0
    idle_fraction = last("cost/idle_fraction") or 0.0
    per_step = (1.0 - idle_fraction) * (last("cost/usd_per_step") or 0.0)  # a step's own cost, not the overheads
    lost_steps = sum(
        max(0, (before.end_step or 0) - after.start_step) for before, after in itertools.pairwise(attempts)
    )
    replayed = min(waste, lost_steps * per_step)
    save_seconds = sum(
        float(mark.details.get("seconds", 0.0)) for a in attempts for mark in a.marks if mark.kind == "checkpoint"
    )
    checkpoints = min(total, save_seconds * usd_per_hour / 3600.0)
    idle = max(0.0, idle_fraction * total - waste - checkpoints)
    parts = [replayed, waste - replayed, checkpoints, idle, last("stragglers/usd") or 0.0]
    scale = min(1.0, total / sum(parts)) if sum(parts) > 0 else 1.0  # estimates: never more than the total
    return CostSplit(total, *(part * scale for part in parts))


def _advice(last: Any) -> list[str]:
    fraction, busy = last("rightsizing/peak_memory_fraction"), last("rightsizing/busy_fraction")
    if fraction is None or busy is None:
        return []
    capacity = last("rightsizing/memory_capacity_gib") or 0.0
    peak = last("rightsizing/peak_memory_gib") or 0.0
    report = RightSizingReport("unknown", int(peak * GIB), int(capacity * GIB), busy)
    return report.suggestions() or ["The machine fits the job: no right-sizing advice."]


def collect(source: str | Path, now: float | None = None) -> RunRecord:
    """Gather what the run under ``source`` left behind.

    Raises:
        ConfigurationError: ``source`` is not a directory, or holds neither checkpoints nor logged metrics.
    """
    root = Path(source)
    if not root.is_dir():
        raise ConfigurationError(f"{source} is not a directory: pass a run's directory or its checkpoint directory.")
    dirs = _checkpoint_dirs(root)
    journals = [d for d in dirs if (d / JOURNAL_DIR).is_dir()]
    if len(journals) > 1:
        raise ConfigurationError(
            f"{source} holds the journals of {len(journals)} runs ({', '.join(str(d) for d in journals)}): pass the "
            "directory of one run."
        )
    metric_files, rows, logged = _metric_rows(root)
    if not dirs and not rows:
        raise ConfigurationError(
            f"{source} holds no checkpoints (ResumableCheckpoint's journal, progress.json or manifests) and no logged "
            "metrics (metrics.csv, W&B run files): pass the run's default_root_dir or its checkpoint dirpath."
        )
    events = sorted((e for d in dirs for e in RunJournal(CheckpointStore(str(d))).events()), key=lambda e: e.unix)
    attempts = _attempts(events)
    progress = []
    for d in dirs:
        try:
            progress.append(json.loads((d / PROGRESS_NAME).read_text()))
        except (OSError, ValueError):
            continue
    seen = [e.unix for e in events] + [float(p["unix"]) for p in progress if "unix" in p]
    last_seen = max(seen) if seen else None
    if attempts and attempts[-1].end_reason == "no end recorded" and progress:
        attempts[-1].end_unix = max(attempts[-1].end_unix or 0.0, *(float(p.get("unix", 0.0)) for p in progress))
        attempts[-1].end_step = max(attempts[-1].end_step or 0, *(int(p.get("global_step", 0)) for p in progress))
    now = time.time() if now is None else now
    status = attempts[-1].end_reason if attempts else "no journal (written by ResumableCheckpoint)"
    if attempts and status == "no end recorded":
        recent = last_seen is not None and now - last_seen < RUNNING_WITHIN_S
        status = "running" if recent else "ended without a word (killed, a lost node, or still starting up)"
        attempts[-1].end_reason = status
    for attempt in attempts[:-1]:
        if attempt.end_reason == "no end recorded":
            attempt.end_reason = "ended without a word (killed or lost)"

    def last(key: str) -> float | None:
        values = [row[key] for row in rows if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
        return float(values[-1]) if values else None

    keys = {key for row in rows for key in row}
    losses = sorted(k for k in keys if "loss" in k and not k.startswith(("cost/", "_")))
    loss_key = "train_loss" if "train_loss" in keys else (losses[0] if losses else None)
    monitors = sorted(k.removeprefix("cost/usd_at_best_") for k in keys if k.startswith("cost/usd_at_best_"))
    monitor_key = next((m for m in monitors if m in keys), None) or ("val_loss" if "val_loss" in keys else None)
    return RunRecord(
        source=root,
        checkpoint_dirs=dirs,
        metric_files=metric_files,
        attempts=attempts,
        rows=rows,
        logged_keys=logged,
        loss_key=loss_key,
        monitor_key=monitor_key if monitor_key != loss_key else None,
        split=_split(attempts, last),
        advice=_advice(last),
        status=status,
        last_seen_unix=last_seen,
    )
