"""How far training got: a small marker that rank 0 rewrites now and then, and the resume banner built from it.

A restarted job resumes from its newest valid checkpoint; the steps the previous attempt trained after that checkpoint
are lost (and were paid for). The checkpoint cannot say how many: the marker can, exactly when the attempt ended by
itself (finished, failed or preempted: its last record is ``final``), and to within ``every_seconds`` after a kill.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from lightning_scale import knobs
from lightning_scale.checkpoint.store import CheckpointStore

__all__ = ["PROGRESS_NAME", "ProgressMarker", "ResumeInfo"]

PROGRESS_NAME = "progress.json"

log = logging.getLogger(__name__)


class ProgressMarker:
    """``progress.json`` in a checkpoint directory: the newest step training reached, written at most every
    ``every_seconds`` in one attempt (no retries, so a slow or lost store never holds training up; a failure is
    logged once and the marker stops for this run).

    Args:
        store: The checkpoint directory.
        every_seconds: Shortest time between two writes (default: ``knobs.PROGRESS_EVERY_S``).
        clock: Monotonic seconds, for the throttle.

    Examples:
        >>> import tempfile
        >>> marker = ProgressMarker(CheckpointStore(tempfile.mkdtemp()), every_seconds=60)
        >>> marker.last_step() is None
        True
        >>> marker.record(7); marker.record(8)  # the second is within 60 s of the first: not written
        >>> marker.last_step(), marker.last_record()
        (7, (7, False))
        >>> marker.record(9, final=True); marker.last_record()  # the attempt ends here
        (9, True)
    """

    def __init__(
        self,
        store: CheckpointStore,
        every_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.every_seconds = knobs.PROGRESS_EVERY_S if every_seconds is None else every_seconds
        self.clock = clock
        self._written_at: float | None = None
        self._broken = False

    def record(self, step: int, force: bool = False, final: bool = False) -> None:
        """Write ``step`` unless the last write is under ``every_seconds`` old and not ``force`` or ``final`` (or
        writing failed); ``final``: the attempt ends at this step."""
        force = force or final
        now = self.clock()
        recent = self._written_at is not None and now - self._written_at < self.every_seconds
        if self._broken or (recent and not force):
            return
        self._written_at = now
        data = json.dumps({"global_step": step, "unix": time.time(), "final": final}).encode()
        try:
            self.store.write_advisory(PROGRESS_NAME, data)
        except Exception as err:  # advisory: training goes on without it
            self._broken = True
            log.warning(f"Not recording progress in {self.store.url(PROGRESS_NAME)} any more ({err}).")

    def last_step(self) -> int | None:
        """The step last recorded (by this or an earlier attempt); ``None`` when there is no readable marker."""
        record = self.last_record()
        return None if record is None else record[0]

    def last_record(self) -> tuple[int, bool] | None:
        """The step last recorded and whether its attempt ended there; ``None`` when there is no readable marker."""
        try:
            data = json.loads(self.store.read_bytes(PROGRESS_NAME))
            return int(data["global_step"]), bool(data.get("final", False))  # older markers have no "final"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class ResumeInfo:
    """What a job resumed from, for the banner it prints at start-up."""

    path: str
    global_step: int
    epoch: int
    age_seconds: float
    last_seen_step: int | None
    last_seen_final: bool = False
    """Whether the previous attempt ended at ``last_seen_step`` by itself (the count is then exact)."""

    @property
    def reached_step(self) -> int | None:
        """The furthest step the previous attempts are known to have reached (``None``: unknown)."""
        return None if self.last_seen_step is None else max(self.last_seen_step, self.global_step)

    @property
    def steps_lost(self) -> int | None:
        """Steps trained after the checkpoint by the previous attempt (at least; ``None``: unknown)."""
        return None if self.reached_step is None else self.reached_step - self.global_step

    def banner(self, cost_line: str | None = None) -> str:
        """The lines printed when training starts again.

        Examples:
            >>> print(ResumeInfo("ckpts/epoch=0-step=40.ckpt", 40, 0, 12.0, 52, True).banner("Cost so far: $0.01."))
            Auto-resuming from ckpts/epoch=0-step=40.ckpt (global step 40, epoch 0, written 12.0 s ago).
              Steps lost: 12 (the previous attempt ended at step 52).
              Cost so far: $0.01.
            >>> print(ResumeInfo("ckpts/epoch=0-step=40.ckpt", 40, 0, 12.0, 52).banner().splitlines()[1])  # killed
              Steps lost: at least 12 (the previous attempt was last recorded at step 52).
        """
        if self.last_seen_step is None:
            lost = "  Steps lost: unknown (no progress record)."
        elif self.last_seen_final:
            lost = f"  Steps lost: {self.steps_lost} (the previous attempt ended at step {self.reached_step})."
        else:
            lost = (
                f"  Steps lost: at least {self.steps_lost} (the previous attempt was last recorded at step "
                f"{self.reached_step})."
            )
        lines = [
            f"Auto-resuming from {self.path} (global step {self.global_step}, epoch {self.epoch}, "
            f"written {self.age_seconds:.1f} s ago).",
            lost,
        ]
        if cost_line:
            lines.append(f"  {cost_line}")
        return "\n".join(lines)
