"""A hung rank exits so that the job is restarted: the Lightning glue of :mod:`lightning_scale.health.watchdog`."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import process_group_timeout, route_trainer_saves
from lightning_scale._trainer_attributes import trainer_callbacks
from lightning_scale.checkpoint.journal import RunJournal
from lightning_scale.errors import ConfigurationError
from lightning_scale.health.stopped import GRACE_S, kill_stopped_peers_after_exit
from lightning_scale.health.watchdog import HANG_EXIT_CODE, ProgressWatchdog, StepAllowance
from lightning_scale.restart import beacon
from lightning_scale.restart.beacon import Beacon

__all__ = ["COLLECTIVE_MARGIN_S", "HangWatchdog"]

JOURNAL_WAIT_S = 5.0  # the most a hung rank waits to write its hang into the run's journal before it exits
COLLECTIVE_MARGIN_S = 60.0
"""How much longer than a watchdog's allowance a collective may wait: time for the hung rank to print its stacks."""


class HangWatchdog(Callback):
    """End a rank that makes no progress, with its stacks in the log and exit code :data:`HANG_EXIT_CODE` (75), so
    that torchrun (``--max-restarts``) or Kubernetes restart the job (a SLURM job is requeued or resubmitted), which
    resumes from its newest valid checkpoint.

    Each rank watches its own progress from a thread that needs no collective (a frozen peer leaves the others
    blocked in a collective: they stop making progress and exit, and the orchestrator restarts everyone; a stopped
    local rank of the same torchrun worker group is killed once the reporting rank has exited,
    :mod:`lightning_scale.health.stopped` says why). Progress is every training and validation batch starting
    and ending. The allowance adapts to the step time measured: ``step_factor`` times the slowest of the last 100
    intervals between two marks, at least ``min_timeout_s``; the phases whose length nothing predicts get
    ``startup_timeout_s``: set-up until the first batch, the first batch of every epoch and of every validation
    (DataLoader workers starting, the first step's compilation), validation batches, and the end of training; the
    first training batch after one of them (its warm-up) is not measured into the step times. Checkpoint saves
    (``ResumableCheckpoint``'s and ``trainer.save_checkpoint``) are not watched: their storage calls have deadlines
    of their own.

    The process group's timeout is kept at least :data:`COLLECTIVE_MARGIN_S` longer than the allowance (raised when
    needed, never lowered): a rank waiting in a collective for a hung peer then lets the peer's own watchdog report
    its stacks first, instead of failing the collective without saying where the peer was stuck.

    Its peers can tell sooner: under warm restarts (the ``lightning-scale`` command under torchrun) every mark is also
    shown to the rank's parent process, and a rank that stands still behind the others while they all wait for it is
    named hung after ``peer_step_factor`` times the slowest recent interval, at least ``peer_min_timeout_s``; its
    stacks are printed and every rank restarts (:mod:`lightning_scale.restart.hangs`). The start-up phases and saves
    above are never judged so.

    Args:
        min_timeout_s: The shortest allowance between two training batches' marks.
        step_factor: Allowance as a multiple of the slowest recent interval between marks.
        startup_timeout_s: Allowance of the phases listed above.
        timeout_s: A fixed allowance between training marks instead of the adaptive one.
        peer_min_timeout_s: The shortest time a rank that its peers wait for may stand still (warm restarts only).
        peer_step_factor: That time as a multiple of the slowest recent interval between marks.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[HangWatchdog(min_timeout_s=120)], logger=False, enable_progress_bar=False)
    """

    def __init__(
        self,
        min_timeout_s: float = 300.0,
        step_factor: float = 20.0,
        startup_timeout_s: float = 1800.0,
        timeout_s: float | None = None,
        peer_min_timeout_s: float = 10.0,
        peer_step_factor: float = 10.0,
    ) -> None:
        if peer_min_timeout_s <= 0 or peer_step_factor <= 0:
            raise ConfigurationError(
                f"peer_min_timeout_s={peer_min_timeout_s} and peer_step_factor={peer_step_factor} must be > 0 "
                "(--hang.peer_min_timeout_s, --hang.peer_step_factor)."
            )
        self.min_timeout_s = min_timeout_s
        self.step_factor = step_factor
        self.startup_timeout_s = startup_timeout_s
        self.timeout_s = timeout_s
        self.peer_min_timeout_s = peer_min_timeout_s
        self.peer_step_factor = peer_step_factor
        self.exit_fn: Callable[[int], Any] = os._exit
        """Ends the process on a hang."""
        self.clock: Callable[[], float] = time.monotonic
        """Monotonic seconds that allowances are measured in (set before ``fit``; a test's fake clock)."""
        self._allowance = StepAllowance(min_timeout_s, step_factor, startup_timeout_s)  # checks the arguments
        self._watchdog: ProgressWatchdog | None = None
        self._last_mark: float | None = None  # when the last mark was made (None after a startup phase)
        self._measuring = False  # whether the interval since the last mark is a step's (not warm-up)
        self._trainer: pl.Trainer | None = None
        self._unroute_saves: Callable[[], None] | None = None  # undoes the routing of trainer.save_checkpoint
        self._collective_timeout_s: float | None = None  # None: no process group
        self._beacon: Beacon | None = None  # the warm-restart parent's view of this rank's progress
        self._armed_s = startup_timeout_s  # the allowance of the phase armed last

    @staticmethod
    @contextmanager
    def pausing(trainer: pl.Trainer, what: str) -> Iterator[None]:
        """Leave ``what`` (a checkpoint save) unwatched by the Trainer's ``HangWatchdog``, if it has one."""
        watchdogs = [cb for cb in trainer_callbacks(trainer) if isinstance(cb, HangWatchdog)]
        with watchdogs[0].paused(what) if watchdogs else contextlib.nullcontext():
            yield

    @staticmethod
    @contextmanager
    def excluding(trainer: pl.Trainer, what: str) -> Iterator[None]:
        """Leave ``what``, a short part of a step (a memory snapshot), unwatched and out of the measured step time."""
        watchdogs = [cb for cb in trainer_callbacks(trainer) if isinstance(cb, HangWatchdog)]
        with watchdogs[0].excluded(what) if watchdogs else contextlib.nullcontext():
            yield

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        advice = (
            f"it is hung (or far slower than its allowance). Exiting with {HANG_EXIT_CODE} so that the job is "
            "restarted from its newest valid checkpoint. Tune it with HangWatchdog(min_timeout_s=..., "
            "step_factor=..., startup_timeout_s=...) (lightning-scale: --hang.min_timeout_s ...), or --hang null to "
            "switch it off."
        )
        self._allowance = StepAllowance(self.min_timeout_s, self.step_factor, self.startup_timeout_s)

        def exit_hung(code: int) -> None:
            # looked up now: a ModelCheckpoint (ResumableCheckpoint) sets up after the other callbacks
            for callback in trainer_callbacks(trainer):
                journal = getattr(callback, "journal", None)
                if isinstance(journal, RunJournal) and self._watchdog is not None:
                    journal.record("hang", trainer.global_step, timeout_s=JOURNAL_WAIT_S, phase=self._watchdog.phase)
            stopped = kill_stopped_peers_after_exit()  # killed after this exit: torchrun sees this code first
            if stopped:
                print(f"lightning-scale: rank {trainer.global_rank}: processes {stopped} of its torchrun worker group "
                      "are stopped and take no SIGTERM (torchrun would wait 30 s for them before the restart); they "
                      f"are killed {GRACE_S:g} s after this rank exits", file=sys.stderr, flush=True)  # fmt: skip
            self.exit_fn(code)

        self._watchdog = ProgressWatchdog(HANG_EXIT_CODE, advice, exit_fn=exit_hung, clock=self.clock)
        self._beacon = beacon.current()
        self._trainer = trainer
        has_group = distributed.has_process_group()
        self._collective_timeout_s = process_group_timeout(trainer.strategy).total_seconds() if has_group else None
        self._unroute_saves = route_trainer_saves(
            trainer, lambda: self.paused("saving a checkpoint (trainer.save_checkpoint)")
        )
        self._startup("set-up, before the first training batch")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._startup(f"epoch {trainer.current_epoch}, waiting for its first batch")

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._mark(f"training step {trainer.global_step + 1} (epoch {trainer.current_epoch}, batch {batch_idx})")

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._mark(f"after training step {trainer.global_step} (callbacks, then the next batch)")

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        # not a mark of this rank's own watchdog: a rank past its forward is ahead of one stuck in it (or in its data),
        # which its peers can only tell by this
        if self._watchdog is not None:
            self._tell_peers(watched=self._measuring)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._startup("validation, waiting for its first batch")

    @override
    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        self._startup(f"validation, after batch {batch_idx}")

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._startup("after validation")

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._startup("the end of training")

    def _startup(self, phase: str) -> None:
        """A phase whose length nothing measured predicts; neither the interval that ends it nor the first batch after
        it (warm-up: the first backward, allocator growth, compilation) is measured."""
        if self._watchdog is not None:
            self._arm(phase, self.startup_timeout_s)
            self._last_mark, self._measuring = None, False
            self._tell_peers(watched=False)

    def _mark(self, phase: str) -> None:
        if self._watchdog is None:
            return
        now = self.clock()
        if self._last_mark is not None and self._measuring:
            self._allowance.measured(now - self._last_mark)
        self._measuring = self._last_mark is not None  # from the second mark after a start-up phase on
        self._last_mark = now
        self._arm(phase, self.allowance_s)
        self._tell_peers(watched=self._measuring)

    def _tell_peers(self, watched: bool) -> None:
        """Show this mark to the warm-restart parent, with the time the peers may wait for the next one."""
        if self._beacon is None:
            return
        slowest = self._allowance.slowest_s()
        allowance = max(self.peer_min_timeout_s, self.peer_step_factor * (slowest or 0.0))
        self._beacon.mark(watched=watched and slowest is not None, allowance_s=allowance)

    @property
    def allowance_s(self) -> float:
        """The allowance between two training marks now: ``timeout_s``, or the one adapted to the step times."""
        return self.timeout_s if self.timeout_s is not None else self._allowance.seconds()

    def _arm(self, phase: str, allowance: float) -> None:
        assert self._watchdog is not None
        self._watchdog.arm(phase, allowance)
        self._armed_s = allowance
        needed = allowance + COLLECTIVE_MARGIN_S
        if self._collective_timeout_s is not None and needed > self._collective_timeout_s:
            distributed.set_timeout(needed)
            rank_zero_info(
                f"HangWatchdog: the process group's timeout is now {needed:.0f} s (was "
                f"{self._collective_timeout_s:.0f} s), {COLLECTIVE_MARGIN_S:.0f} s more than the allowance of {phase}."
            )
            self._collective_timeout_s = needed

    @contextmanager
    def paused(self, what: str) -> Iterator[None]:
        """Leave ``what`` unwatched (outside ``fit``: nothing to do)."""
        watchdog = self._watchdog
        if watchdog is None:
            yield
            return
        phase = watchdog.phase
        watchdog.arm(what, None)
        self._tell_peers(watched=False)
        try:
            yield
        finally:
            self._startup(f"{phase}, after {what}")  # the save's length is not a step's

    @contextmanager
    def excluded(self, what: str) -> Iterator[None]:
        """Leave ``what`` unwatched; the phase it interrupts goes on afterwards with its allowance from then, and its
        length is not measured into the step time (outside ``fit``: nothing to do)."""
        watchdog = self._watchdog
        if watchdog is None:
            yield
            return
        phase, allowance, started = watchdog.phase, self._armed_s, self.clock()
        watchdog.arm(what, None)
        try:
            yield
        finally:
            if self._last_mark is not None:
                self._last_mark += self.clock() - started
            self._arm(phase, allowance)

    def _stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        if self._unroute_saves is not None:
            self._unroute_saves()
        self._trainer, self._unroute_saves = None, None
