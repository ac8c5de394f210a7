"""Preemption notices delivered as a file (Kubernetes preStop hooks, custom schedulers)."""

from __future__ import annotations

import os
import time

from lightning_scale.preemption.notice import Notice
from lightning_scale.preemption.polling import PollingSource, validate_interval

__all__ = ["FileNotice"]


class FileNotice(PollingSource):
    """A notice when ``path`` exists; its text, if any, is kept as the detail.

    Args:
        path: File whose appearance means "preempted" (e.g. written by a Kubernetes ``preStop`` hook).
        poll_interval: Seconds between checks.
        grace_seconds: Time between the file appearing and the hard kill (Kubernetes'
            ``terminationGracePeriodSeconds``).
        ignore_existing: Ignore a file written before the source started (an earlier attempt's notice). ``False``
            where the writer removes stale notices itself and a notice may come while the job starts: the SLURM
            example deletes it when each run of the job starts, and its trap may write it before training does.

    Examples:
        >>> FileNotice("/tmp/preempted", poll_interval=0.5).poll() is None
        True
    """

    name = "file"

    def __init__(
        self, path: str, poll_interval: float = 1.0, grace_seconds: float = 25.0, ignore_existing: bool = True
    ) -> None:
        super().__init__(poll_interval)
        self.path = str(path)
        self.grace_seconds = validate_interval(grace_seconds, "grace_seconds")
        self.ignore_existing = ignore_existing
        self._seen_empty = False
        self._since_unix: float | None = None

    def start(self) -> None:
        """Watch for the file; one left from before this start (an earlier attempt's notice) is ignored unless
        ``ignore_existing`` is ``False``."""
        if self._since_unix is None and self.ignore_existing:
            self._since_unix = time.time() - 1.0  # coarse file times
        super().start()

    def _check(self) -> Notice | None:
        if not os.path.exists(self.path) or os.path.getmtime(self.path) < (self._since_unix or 0.0):
            return None
        with open(self.path, errors="replace") as handle:
            detail = handle.read(200).strip()
        if not detail and not self._seen_empty:  # `echo reason > file` creates it before writing: look once more
            self._seen_empty = True
            return None
        now = time.time()
        return Notice("file", now, now + self.grace_seconds, detail or self.path)
