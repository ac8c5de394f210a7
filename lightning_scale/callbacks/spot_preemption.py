"""Spot preemption: a notice on any rank → every rank stops at the same step → durable checkpoint → restartable exit."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed, knobs
from lightning_scale._lightning_internals import (
    process_dataloaders_with,
    shut_down_dataloader_workers,
    skip_sigterm_broadcast,
    turn_off_slurm_auto_requeue,
)
from lightning_scale._process_local import ProcessLocal
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.callbacks._state_key import settings_state_key
from lightning_scale.callbacks._step_vote import StepVote
from lightning_scale.callbacks.hang_watchdog import JOURNAL_WAIT_S
from lightning_scale.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStorageError
from lightning_scale.data import shield_workers
from lightning_scale.errors import ConfigurationError
from lightning_scale.preemption import Notice, NoticeSource, SignalNotice

__all__ = ["SpotPreemption"]

log = logging.getLogger(__name__)


class SpotPreemption(ProcessLocal, Callback):
    """Stop every rank at the same step when any rank gets a preemption notice, checkpoint, and exit non-zero.

    Notice sources (signals by default; AWS, GCP, Azure metadata and files in :mod:`lightning_scale.preemption`)
    only raise a flag. Every ``check_every_n_steps`` training steps (and validation batches, during fit) the ranks
    vote on it with one small collective (one per step for every lightning-scale callback that votes), so a notice
    seen by ANY rank stops all of them after the same step. On several processes that vote is started without
    waiting and read at the next voting step, so it costs no wait for the slowest rank; every rank then stops one step
    after the vote, still the same step everywhere (when a vote that cannot wait, such as ``DivergenceRollback``'s,
    runs in the same step, the notice rides in it and is answered at once). Then the run's
    :class:`~lightning_scale.callbacks.ResumableCheckpoint` saves the full state (unless the last
    measured save time says it cannot finish before the notice's deadline: then the previous valid checkpoint stays,
    untouched), the ``preemption/*`` metrics go to every logger, loggers (and a W&B run) are finished, dataloader
    workers are stopped, and the process exits with ``exit_code``, which orchestrators (``torchrun
    --max-restarts``, SLURM requeue, a Kubernetes restart policy) read as a failure to restart, never as
    "finished". The restarted job resumes exactly. A notice during validation stops there: the checkpoint holds the
    last training step, and the resumed run trains on without that validation (Lightning skips the validation of
    the step a checkpoint was written at; training is unchanged by it). DataLoader worker processes survive the
    signals the sources listen to (SLURM sends them to every process of the job; a worker that died of one would fail
    the training process before its save): see :class:`~lightning_scale.data.ShieldFromJobSignals`.

    Logged metrics (rank 0, at the preemption step): ``preemption/step``, ``preemption/seconds_to_durable``
    (notice to durable checkpoint), ``preemption/saved`` (1.0, or 0.0 when the deadline made it skip the save).

    Args:
        sources: Notice sources to watch; default ``[SignalNotice()]`` (SIGTERM, SIGUSR1).
        check_every_n_steps: Training steps between two votes (>= 1).
        exit_code: Process exit code after a preemption (1-255); 143 is the SIGTERM convention (128 + 15).
        slurm_requeue: Inside a SLURM job (``SLURM_JOB_ID`` set), rank 0 runs ``scontrol requeue <job id>`` after the
            checkpoint, so the job goes back to the queue and resumes (submit with ``sbatch --requeue``). Lightning's
            own SLURM auto-requeue (``SLURMEnvironment(auto_requeue=True)``, which would save ``hpc_ckpt_*`` files and
            requeue the job a second time) is turned off for the fit.
        max_slurm_requeues: The most times a job is requeued: a run that starts with ``SLURM_RESTART_COUNT`` at this
            count (every requeue counts, ours, an operator's or SLURM's own after a node failure) checkpoints, says
            so and exits without requeueing, so that a job whose every run is preempted (a time limit shorter than
            start-up plus one checkpoint interval) cannot loop forever. ``None``: no limit.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_scale.callbacks import ResumableCheckpoint
        >>> from lightning_scale.preemption import AWSSpotNotice, SignalNotice
        >>> callbacks = [ResumableCheckpoint(dirpath="memory://run"), SpotPreemption([SignalNotice(), AWSSpotNotice()])]
        >>> trainer = Trainer(callbacks=callbacks, logger=False, enable_progress_bar=False)
    """

    METRIC_KEYS = ("preemption/step", "preemption/seconds_to_durable", "preemption/saved")
    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {
        "_unshield": lambda: _nothing,
        "_restore_sigterm_broadcast": lambda: _nothing,
        "_restore_auto_requeue": lambda: _nothing,
        "_checkpoint": None,
    }

    def __init__(
        self,
        sources: Sequence[NoticeSource] | None = None,
        check_every_n_steps: int = 1,
        exit_code: int = 143,
        slurm_requeue: bool = True,
        max_slurm_requeues: int | None = 20,
    ) -> None:
        if check_every_n_steps < 1:
            raise ConfigurationError(f"check_every_n_steps={check_every_n_steps} must be >= 1 (SpotPreemption).")
        if not 1 <= exit_code <= 255:
            raise ConfigurationError(
                f"exit_code={exit_code} must be in 1..255; 0 would tell the orchestrator 'finished'."
            )
        if max_slurm_requeues is not None and max_slurm_requeues < 0:
            raise ConfigurationError(
                f"max_slurm_requeues={max_slurm_requeues} must be >= 0 (0: never requeue), or None for no limit."
            )
        self.sources: list[NoticeSource] = list(sources) if sources is not None else [SignalNotice()]
        bad = [s for s in self.sources if not isinstance(s, NoticeSource)]
        if bad:
            raise TypeError(f"sources={bad!r} are not notice sources (start/poll/acknowledge/stop).")
        self.check_every_n_steps = check_every_n_steps
        self.exit_code = exit_code
        self.slurm_requeue = slurm_requeue
        self.max_slurm_requeues = max_slurm_requeues
        self._checkpoint: ResumableCheckpoint | None = None
        self._started = False
        self._preempted: dict[str, Any] | None = None  # the notice that stopped the run, kept in the checkpoint
        self._last_voted_step = -1
        self._notice: Notice | None = None  # this rank's, at the last vote
        self._unshield: Callable[[], None] = _nothing
        self._restore_sigterm_broadcast: Callable[[], None] = _nothing
        self._restore_auto_requeue: Callable[[], None] = _nothing

    @property
    @override
    def state_key(self) -> str:
        return settings_state_key(self, self._generate_state_key, check_every_n_steps=self.check_every_n_steps)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._checkpoint = ResumableCheckpoint.of(trainer, "SpotPreemption (to save the full state on a notice)")
        StepVote.of(trainer).join(self, self._ballot, deferred=True)
        if self.slurm_requeue:  # before the stage, when Lightning would install its handlers
            self._restore_auto_requeue = turn_off_slurm_auto_requeue(trainer)
        signals = sorted(
            {name for source in self.sources if isinstance(source, SignalNotice) for name in source.signals}
        )
        if signals:  # SLURM signals every process of the job: DataLoader workers must outlive it until the save
            self._unshield = process_dataloaders_with(trainer, lambda loader: _shielded(loader, signals), order=1)
        # Pollers from now on. Signal handlers only once Lightning installed its own (below): installed earlier, they
        # would become the "original" handlers that Lightning puts back after fit.
        for source in self.sources:
            if not isinstance(source, SignalNotice):
                source.start()
        self._started = True

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning registers its SIGTERM handler (which runs a collective inside the handler) right before the
        # stage; the sanity check is the first hook after that, on_train_start the first without a sanity check.
        self._start_sources()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "preempted": self._preempted}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version(state_dict, "SpotPreemption")
        self._preempted = state_dict.get("preempted")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_voted_step = trainer.global_step  # the restored step was checkpointed already
        if self._preempted is not None:
            p = self._preempted
            rank_zero_info(
                f"Resumed after a preemption: {p['source']} notice, checkpointed at step {p['step']} (the step every "
                f"rank stopped at, so no step was lost), {time.time() - p['received_unix']:.1f} s after the notice."
            )
            self._preempted = None
        self._start_sources()
        # Lightning broadcasts rank 0's SIGTERM flag every step, a collective; only its own handler sets that flag, and
        # ours holds SIGTERM now: the broadcast can only say "no". Unless a SIGTERM came before ours took over.
        holds_sigterm = any(isinstance(s, SignalNotice) and "SIGTERM" in s.signals for s in self.sources)
        if holds_sigterm and not distributed.any_rank(trainer.received_sigterm):
            self._restore_sigterm_broadcast = skip_sigterm_broadcast(trainer)

    def _start_sources(self) -> None:
        for source in self.sources:
            source.start()  # idempotent: pollers keep running, signal handlers are installed again
        self._started = True

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if StepVote.of(trainer).agreed(self, trainer, outputs, batch_idx):
            self._preempt(trainer, self._notice)

    def _ballot(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> bool | None:
        # Vote only right after an optimizer step: with gradient accumulation, stopping inside the accumulation window
        # would lose the gradients gathered so far. global_step is the same on every rank, so all ranks vote alike.
        if trainer.global_step == self._last_voted_step or trainer.global_step % self.check_every_n_steps:
            return None
        self._last_voted_step = trainer.global_step
        self._notice = self._local_notice()
        return self._notice is not None

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: STEP_OUTPUT,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        # A notice during a long validation inside fit is not left waiting for the next training step. The
        # checkpoint holds the training state of the last step; the resumed run skips the rest of this validation.
        if not self._started or trainer.sanity_checking or batch_idx % self.check_every_n_steps:
            return
        local = self._local_notice()
        if distributed.any_rank(local is not None):
            self._preempt(trainer, local)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # before Lightning's own teardown restores the handlers it found, so that none of its handlers outlives fit
        self._stop_sources()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        StepVote.of(trainer).leave(self)
        self._undo()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._undo()

    def _undo(self) -> None:
        """Stop the sources and undo what setup changed in the fit's loaders and SLURM environment."""
        self._stop_sources()
        self._unshield()
        self._restore_auto_requeue()
        self._restore_auto_requeue = _nothing

    def _stop_sources(self) -> None:
        self._restore_sigterm_broadcast()
        self._restore_sigterm_broadcast = _nothing
        if self._started:
            for source in self.sources:
                source.stop()
            self._started = False

    def _local_notice(self) -> Notice | None:
        notices = [notice for notice in (source.poll() for source in self.sources) if notice is not None]
        return min(notices, key=lambda n: n.deadline_unix) if notices else None

    def _preempt(self, trainer: pl.Trainer, local: Notice | None) -> None:
        seen = [(rank, notice) for rank, notice in enumerate(distributed.all_gather_object(local)) if notice]
        rank, notice = min(seen, key=lambda item: item[1].deadline_unix)
        assert self._checkpoint is not None
        save = distributed.broadcast_object(self._can_save_in_time(notice))
        choice = (
            f"saving a checkpoint at step {trainer.global_step}."
            if save
            else "too little time, NOT saving; the previous valid checkpoint stays and the run resumes from it."
        )
        last = self._checkpoint.last_save_seconds
        measured = "no save measured yet" if last is None else f"the last save took {last:.2f} s"
        rank_zero_info(
            f"Preemption notice from {notice.source} on rank {rank} ({notice.detail}); {notice.seconds_left():.1f} s "
            f"left, {measured}: {choice}"
        )
        self._preempted = {"source": notice.source, "received_unix": notice.received_unix, "step": trainer.global_step}
        path = None
        if save:
            try:
                # again where this step is saved already (a notice seen in the validation after its checkpoint),
                # so that the checkpoint the run resumes from holds the notice, for the resumed run's banner
                path = self._checkpoint.save_now(trainer, again=True)
                self._checkpoint.release_memory_snapshots(trainer)  # no newer than the checkpoint: not needed
            except CheckpointStorageError as err:  # raised on every rank; the previous checkpoint is untouched
                rank_zero_warn(f"The emergency checkpoint failed ({err}); exiting anyway.")
        self._report(trainer, notice, path, time.time() - notice.received_unix)
        journal = self._checkpoint.journal
        if journal is not None and trainer.is_global_zero:  # bounded: the notice's grace period is short
            details = {"source": notice.source, "noticed_on_rank": rank, "saved": path is not None}
            journal.record("preemption", trainer.global_step, timeout_s=JOURNAL_WAIT_S, **details)
        self._checkpoint.attempt_ends(trainer, timeout_s=JOURNAL_WAIT_S)  # bounded, as the journal: the grace is short
        self._acknowledge()
        self._exit(trainer)

    def _acknowledge(self) -> None:
        """Each source answers its own notice (Azure approves its event); a failure must not stop the exit."""
        for source in self.sources:
            own = source.poll()
            if own is not None:
                try:
                    source.acknowledge(own)
                except Exception as err:
                    log.warning(f"Acknowledging the {own.source} notice failed ({type(err).__name__}: {err}).")

    def _can_save_in_time(self, notice: Notice) -> bool:
        assert self._checkpoint is not None
        expected = self._checkpoint.last_save_seconds
        return expected is None or notice.seconds_left() > knobs.PREEMPTION_SAVE_MARGIN * expected

    def _report(self, trainer: pl.Trainer, notice: Notice, path: str | None, seconds: float) -> None:
        step = trainer.global_step
        metrics = {"preemption/step": float(step), "preemption/seconds_to_durable": seconds}
        metrics["preemption/saved"] = float(path is not None)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                try:
                    logger.log_metrics(metrics, step=step)
                    logger.finalize("failed")  # Lightning's status for a run that did not finish
                    if isinstance(logger, WandbLogger):  # Lightning never finishes the run; os._exit would cut it off
                        logger.experiment.mark_preempting()
                        logger.experiment.finish(exit_code=self.exit_code)
                except Exception as err:  # every rank must reach the exit barrier
                    log.warning(f"{type(logger).__name__} failed while finishing ({type(err).__name__}: {err}).")
        where = f"checkpoint {path} durable {seconds:.2f} s after the notice" if path else "no new checkpoint"
        rank_zero_warn(f"Preempted at step {step} ({notice.source}): {where}; exiting with code {self.exit_code}.")

    def _requeue_on_slurm(self) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        if not (self.slurm_requeue and job):
            return
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if self.max_slurm_requeues is not None and restarts >= self.max_slurm_requeues:
            log.warning(
                f"Not requeueing SLURM job {job}: it was requeued {restarts} times already "
                f"(max_slurm_requeues={self.max_slurm_requeues}). Resubmit it to resume from its newest checkpoint, "
                "or raise SpotPreemption's max_slurm_requeues."
            )
            return
        limit = "" if self.max_slurm_requeues is None else f" of at most {self.max_slurm_requeues}"
        # Said before: the requeue cancels the job step at once, and srun drops what its tasks print after that.
        rank_zero_info(
            f"Requeueing SLURM job {job} (requeue {restarts + 1}{limit}); it resumes from the checkpoint when it "
            "starts again."
        )
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=30)
            problem = None if done.returncode == 0 else f"exit code {done.returncode}: {done.stderr.strip()[:200]}"
        except (OSError, subprocess.TimeoutExpired) as err:
            problem = f"{type(err).__name__}: {err}"
        if problem and "pending execution" in problem:  # requeued already: by an operator, or by SLURM's preemption
            rank_zero_info(f"SLURM job {job} was back in the queue already.")
        elif problem:
            log.warning(f"`scontrol requeue {job}` failed ({problem}); resubmit the job to resume it.")

    def _exit(self, trainer: pl.Trainer) -> None:
        if trainer.is_global_zero:
            self._requeue_on_slurm()
        # Sources are not stopped: our flag-only signal handlers must stay (a SIGTERM from the requeue or from
        # torchrun must not reach Lightning's handler, which runs a collective), and daemon pollers end with us.
        shut_down_dataloader_workers(trainer)  # torchdata workers would outlive os._exit by seconds
        distributed.barrier()
        distributed.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.exit_code)


def _shielded(loader: Any, signals: Sequence[str]) -> Any:
    shield_workers(loader, signals)
    return loader


def _nothing() -> None:
    """Undoes nothing (no loader was shielded)."""
