"""What a preemption notice is, and the protocol every notice source follows."""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol, runtime_checkable

__all__ = ["Notice", "NoticeSource"]


@dataclasses.dataclass(frozen=True)
class Notice:
    """A warning that this machine is about to be taken away.

    Attributes:
        source: Who said so (``"SIGTERM"``, ``"aws"``, ``"gcp"``, ``"azure"``, ``"file"``).
        received_unix: When this process learned of it (``time.time()``).
        deadline_unix: When the machine is expected to go away.
        detail: The provider's own words (action, event id, ...), for the log.
    """

    source: str
    received_unix: float
    deadline_unix: float
    detail: str = ""

    def seconds_left(self, now_unix: float | None = None) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline_unix - (time.time() if now_unix is None else now_unix)


@runtime_checkable
class NoticeSource(Protocol):
    """Something that can tell that a preemption is coming. Sources never raise on a bad answer; they warn."""

    def start(self) -> None:
        """Begin watching (install handlers, start a polling thread). Called from the main thread."""

    def poll(self) -> Notice | None:
        """The notice seen so far, if any; cheap and non-blocking (called at every check)."""

    def acknowledge(self, notice: Notice) -> None:
        """Tell the provider the job is ready to go (after the emergency checkpoint is durable)."""

    def stop(self) -> None:
        """Stop watching and undo ``start``; safe to call twice or without ``start``."""
