"""The run's journal: what happened to a job, attempt by attempt, kept beside its checkpoints for the run report.

Each event is a small JSON file of its own in ``<dirpath>/journal/`` (one write, no read-modify-write, so it works the
same on local disk and object stores, and two ranks never contend for one file). Writing is advisory, like
``progress.json``: one try per event, a failure logged and never raised; after :data:`MAX_FAILURES` failures only the
events that end an attempt are still tried, and a caller on its way out bounds its wait (``timeout_s``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from lightning_scale.checkpoint.store import CheckpointStore

__all__ = ["JOURNAL_DIR", "EventKind", "JournalEvent", "RunJournal", "attempt_id"]

JOURNAL_DIR = "journal"
MAX_FAILURES = 3
FINAL_KINDS = ("preemption", "hang", "end")

EventKind = Literal["start", "checkpoint", "preemption", "hang", "end"]

log = logging.getLogger(__name__)


def attempt_id() -> str:
    """This process's attempt of the job: its host, the launcher's restart counts and its parent, stable within one
    attempt on every rank of a node (torchrun's restart count, SLURM's requeue count, a warm restart's parent)."""
    restarts = [os.environ.get(name, "0") for name in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")]
    return f"{socket.gethostname()}-{'.'.join(restarts)}-{os.getppid()}-{os.environ.get('LIGHTNING_SCALE_ATTEMPT', 0)}"


@dataclass(frozen=True)
class JournalEvent:
    """One thing that happened to the job.

    Args:
        kind: ``start`` (an attempt began training, at ``step``), ``checkpoint`` (one was published), ``preemption``
            (every rank stopped for a notice), ``hang`` (a rank's watchdog ended it), ``end`` (the attempt ended:
            ``details["reason"]`` is ``finished``, ``preempted``, ``usage_error`` or ``failed``).
        unix: When, in seconds since the epoch.
        step: The global step at that moment.
        rank: The global rank that wrote it.
        attempt: :func:`attempt_id` of the writer.
        details: What else is known (world size, nodes, save seconds, the notice, the phase of a hang...).
    """

    kind: EventKind
    unix: float
    step: int
    rank: int = 0
    attempt: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        """The event as UTF-8 JSON."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JournalEvent:
        """Parse an event; ``ValueError``, ``KeyError`` or ``TypeError`` when it is not one."""
        raw = json.loads(data)
        return cls(
            kind=raw["kind"],
            unix=float(raw["unix"]),
            step=int(raw["step"]),
            rank=int(raw.get("rank", 0)),
            attempt=str(raw.get("attempt", "")),
            details=dict(raw.get("details", {})),
        )


class RunJournal:
    """The events of a run in ``journal/`` of its checkpoint directory.

    Args:
        store: The checkpoint directory.
        rank: The global rank that writes through this journal.

    Examples:
        >>> import tempfile
        >>> journal = RunJournal(CheckpointStore(tempfile.mkdtemp()))
        >>> journal.record("start", step=0, world_size=2)
        >>> journal.record("end", step=10, reason="finished")
        >>> [(e.kind, e.step, e.details) for e in journal.events()]
        [('start', 0, {'world_size': 2}), ('end', 10, {'reason': 'finished'})]
    """

    def __init__(self, store: CheckpointStore, rank: int = 0) -> None:
        self.store = store
        self.rank = rank
        self._failures = 0
        self._ready = False

    def record(self, kind: EventKind, step: int, timeout_s: float | None = None, **details: Any) -> None:
        """Write one event; with ``timeout_s``, wait at most that long for it (the write goes on in the background)."""
        if self._failures >= MAX_FAILURES and kind not in FINAL_KINDS:
            return
        event = JournalEvent(kind, time.time(), int(step), self.rank, attempt_id(), details)
        if timeout_s is None:
            self._write(event)
            return
        writer = threading.Thread(target=self._write, args=(event,), daemon=True, name="lightning-scale-journal")
        writer.start()
        writer.join(timeout_s)

    def _write(self, event: JournalEvent) -> None:
        name = f"{JOURNAL_DIR}/{time.time_ns():020d}-r{self.rank}-{event.kind}.json"
        try:
            if not self._ready and not self.store.is_object_store:  # object stores have no directories
                self.store.fs.makedirs(self.store.path(JOURNAL_DIR), exist_ok=True)
            self._ready = True
            self.store.write_advisory(name, event.to_json())
        except Exception as err:  # advisory: training goes on without it
            self._failures += 1
            log.warning(f"Could not write {event.kind!r} into the journal {self.store.url(JOURNAL_DIR)} ({err}).")

    def events(self) -> list[JournalEvent]:
        """Every readable event, oldest first (unreadable files are skipped with a warning)."""
        journal = CheckpointStore(self.store.url(JOURNAL_DIR))
        try:
            names = [name for name in journal.names() if name.endswith(".json")]
        except (FileNotFoundError, OSError):
            return []
        events = []
        for name in sorted(names):
            try:
                events.append(JournalEvent.from_json(journal.read_bytes(name)))
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning(f"Skipping {journal.url(name)}: not a journal event ({err}).")
        return sorted(events, key=lambda e: e.unix)
