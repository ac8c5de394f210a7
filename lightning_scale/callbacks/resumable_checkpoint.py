"""Atomic, validated, auto-resuming checkpoints: a drop-in subclass of Lightning's ``ModelCheckpoint``."""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar, Literal, TypeVar
from weakref import proxy

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import (
    dump_checkpoint,
    restore_from_when_unset,
    trainer_logs_this_step,
    writes_sharded_checkpoints,
)
from lightning_scale._process_local import ProcessLocal
from lightning_scale.callbacks._checkpoint_io import ShardedAwareCheckpointIO, plugin_save_file
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.callbacks.cost_tracker import CostTracker
from lightning_scale.callbacks.data_state import DataStateCheckpoint
from lightning_scale.callbacks.wandb_resume import WandbResume
from lightning_scale.checkpoint.background import BackgroundWriter, HostStager
from lightning_scale.checkpoint.cadence import AutoCadence
from lightning_scale.checkpoint.manifest import (
    PREVIOUS_SUFFIX,
    UNFINISHED,
    Manifest,
    find_newest_valid,
    list_manifests,
)
from lightning_scale.checkpoint.progress import ProgressMarker, ResumeInfo
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore, UnusableStorageError
from lightning_scale.checkpoint.unvouched import find_newest_unvouched
from lightning_scale.checkpoint.writer import CheckpointWriter
from lightning_scale.errors import ConfigurationError, UsageError

__all__ = ["ResumableCheckpoint"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ResumableCheckpoint(ProcessLocal, ModelCheckpoint):
    """Checkpoints that are atomic, validated on resume, pruned safely and resumed automatically.

    A subclass of Lightning's ``ModelCheckpoint``: ``monitor``/``save_top_k``, ``save_last`` and
    ``trainer.fit(ckpt_path="last")`` keep working. On top of it:

    - **triggers**: every ``every_n_train_steps`` and/or every ``every_n_minutes`` of wall time; the time decision is
      a vote of all ranks at the same step, so no rank saves alone and none waits forever. ``every_n_minutes="auto"``
      with ``mean_time_between_interruptions_hours`` saves at the Young/Daly optimum ``sqrt(2 C M)`` for the
      measured save time ``C`` (median of the last 5 saves; 10 s assumed before the first) and that mean time ``M``,
      re-evaluated after every save and logged as ``checkpoint/interval_minutes`` with ``checkpoint/save_seconds``;
    - **asynchronous**: with ``async_save=True`` training is blocked only while the state is gathered and copied to
      host memory; rank 0 then writes, uploads and publishes it on a background thread. At most one state is in
      flight: the next save (and the end of fit) waits for the previous one. A background save that fails is reported
      at once and never published, so the previous valid checkpoint stays the one to resume from, and training goes
      on; ``save_now`` (preemption) waits for the save in flight, then saves synchronously;
    - **sharded** (``sharded=True``; the default for strategies that shard the state, like ``model_parallel``): each
      checkpoint is a directory that every rank writes its part of in parallel through ``torch.distributed.checkpoint``
      (a tensor several ranks hold is written once); its manifest lists every file with its size and sha256.
      ``consolidate_checkpoint`` turns one into a single file;
    - **atomic**: each file is written under a temporary name, flushed (``fsync`` on local disk), renamed, and then
      vouched for by ``<name>.manifest.json`` holding its size and sha256; a partial or corrupt checkpoint is never
      chosen for resume, the newest valid one is, with a warning naming the bad file. A name that already holds a
      checkpoint (``last.ckpt``) is replaced only after the old one was set aside, so a crash never loses both;
    - **retention**: ``keep_last_k`` newest checkpoints of this run are kept, ``last.ckpt`` not counted (with
      ``monitor`` set, the best ``save_top_k`` are kept as ``ModelCheckpoint`` does; ``save_top_k=-1`` keeps all,
      ``0`` saves ``last.ckpt`` only); the newest valid checkpoint is
      never deleted, and checkpoints of other runs in the same directory are never touched;
    - **generations**: a fit that starts behind newer checkpoints in ``dirpath`` (``ckpt_path`` set to an older
      one, or a fresh run beside an old one) warns, keeps them, and writes a new generation that the next
      auto-resume prefers; storage failures on rank 0 raise ``CheckpointStorageError`` on every rank;
    - **storage**: ``dirpath`` is a local path or any fsspec URL (``memory://``, ``s3://``, ``gs://``, ...);
    - **auto-resume**: when ``fit`` starts without ``ckpt_path``, it resumes from the newest valid checkpoint in
      ``dirpath``, so an orchestrator that re-runs the same command continues the job;
    - **full state**: weights, optimizers, LR schedulers, AMP scaler, loop progress and callback states (Lightning's
      checkpoint), plus every rank's data position and RNG states through :class:`DataStateCheckpoint`, which is
      added to the Trainer when it has none.

    Args:
        dirpath: Directory or fsspec URL for checkpoints. Default: ``<default_root_dir>/checkpoints``, the same on
            every restart (unlike ``ModelCheckpoint``'s versioned default), so auto-resume finds it.
        filename: Checkpoint name pattern as in ``ModelCheckpoint`` (default ``{epoch}-{step}``); no ``/``.
        monitor: Metric to rank checkpoints by, as in ``ModelCheckpoint``; ``None`` keeps the newest ones.
        mode: ``"min"`` or ``"max"`` for ``monitor``.
        every_n_train_steps: Save every this many optimizer steps.
        every_n_minutes: Save when this many minutes of wall time passed since the last save (> 0), or ``"auto"``.
        mean_time_between_interruptions_hours: Expected hours between interruptions (e.g. from the spot market's
            interruption rate), for ``every_n_minutes="auto"``.
        every_n_epochs: Save every this many epochs (default: every epoch when no other trigger is set).
        local_cache_dir: A local directory that absorbs each save (training waits for the local copy only); rank 0
            then uploads it to ``dirpath`` on its writer thread, at most one upload in flight. Single files only.
        async_save: Write checkpoints on a background thread; training waits only for a host-memory copy of the
            state. ``C`` of the automatic cadence is then that blocked time.
        sharded: Save each checkpoint as a directory of per-rank shards (``None``: when the strategy shards the
            state). With ``async_save``, every rank writes its shards on its writer thread, over a process group of
            its own (gloo).
        keep_last_k: Keep this many newest checkpoints of this run (``None`` keeps all). Used when ``monitor`` is
            ``None`` and ``save_top_k`` is 1.
        save_top_k: As in ``ModelCheckpoint``: with ``monitor`` set, keep this many best checkpoints; without it, ``0``
            saves none (``last.ckpt`` only, with ``save_last``), ``-1`` keeps every checkpoint, ``1`` (the default)
            keeps the ``keep_last_k`` newest. Loggers see this value (``WandbLogger(log_model=True)`` uploads each
            checkpoint as it is written only with ``-1``, else the best and last at the end, as with the stock class).
        save_last: Also maintain ``last.ckpt`` (``True``, or ``"link"`` for a symlink), as in ``ModelCheckpoint``.
        auto_resume: Resume from the newest valid checkpoint in ``dirpath`` when ``fit`` gets no ``ckpt_path``.
        data_state: Add a :class:`DataStateCheckpoint` to the Trainer when it has none (it makes the training
            loaders resume exactly; add your own ``DataStateCheckpoint(make_loaders_resumable=False)`` to opt out).
        strict_resume: Refuse to train, before the first step, when the training data cannot resume exactly (the
            ``DataStateCheckpoint`` of the Trainer becomes ``strict``); by default that is a warning.
        wandb_resume: Add a :class:`WandbResume` to a Trainer with a ``WandbLogger`` when it has none, so a restarted
            job continues the same W&B run.
        verbose: Log each save, as in ``ModelCheckpoint``.
        save_on_exception: Also save when fit raises, as in ``ModelCheckpoint``.
        save_weights_only: Refused when ``True``: a weights-only file cannot resume a run (add a stock
            ``ModelCheckpoint(save_weights_only=True)`` for those).
        auto_insert_metric_name: As in ``ModelCheckpoint``.
        train_time_interval: ``ModelCheckpoint``'s name for ``every_n_minutes`` (a ``timedelta``).
        save_on_train_epoch_end: As in ``ModelCheckpoint``.
        enable_version_counter: As in ``ModelCheckpoint`` (``-v1`` names when a name is taken).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> checkpoint = ResumableCheckpoint(dirpath="memory://run", every_n_train_steps=100, keep_last_k=2)
        >>> trainer = Trainer(callbacks=[checkpoint], logger=False, enable_progress_bar=False)
    """

    METRIC_KEYS = ("checkpoint/interval_minutes", "checkpoint/save_seconds")
    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {
        "_writer": BackgroundWriter, "_stager": HostStager, "_staged": None, "_checkpoint_writer": None,
        "_save_group": None, "_trainer": None, "_store": None, "_cache": None, "_progress": None,
    }  # fmt: skip

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        every_n_train_steps: int | None = None,
        every_n_minutes: float | Literal["auto"] | None = None,
        mean_time_between_interruptions_hours: float | None = None,
        every_n_epochs: int | None = None,
        async_save: bool = False,
        sharded: bool | None = None,
        local_cache_dir: str | None = None,
        keep_last_k: int | None = 3,
        save_top_k: int = 1,
        save_last: bool | Literal["link"] | None = None,
        auto_resume: bool = True,
        data_state: bool = True,
        strict_resume: bool = False,
        wandb_resume: bool = True,
        verbose: bool = False,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        auto_insert_metric_name: bool = True,
        train_time_interval: timedelta | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        if save_weights_only:
            raise ConfigurationError(
                "ResumableCheckpoint saves the full training state, so that a run resumes where it stopped; "
                "save_weights_only=True would make every checkpoint unresumable. For weights-only files, add a stock "
                "lightning.pytorch.callbacks.ModelCheckpoint(save_weights_only=True) beside it."
            )
        if save_top_k < -1:
            raise ConfigurationError(f"save_top_k={save_top_k} must be >= -1, as in ModelCheckpoint (-1 keeps all).")
        if monitor is None and save_top_k > 1:
            raise ConfigurationError(
                f"save_top_k={save_top_k} ranks checkpoints by a metric: set monitor=..., or keep the {save_top_k} "
                f"newest with keep_last_k={save_top_k} (without a monitor, save_top_k is -1, 0 or 1, as in "
                "ModelCheckpoint)."
            )
        if train_time_interval is not None:
            if every_n_minutes is not None:
                raise ConfigurationError(
                    f"Pass either train_time_interval={train_time_interval} (ModelCheckpoint's name) or "
                    f"every_n_minutes={every_n_minutes!r}, not both: they set the same trigger."
                )
            every_n_minutes = train_time_interval.total_seconds() / 60.0
        auto = every_n_minutes == "auto"
        if auto != (mean_time_between_interruptions_hours is not None):
            raise ConfigurationError(
                "every_n_minutes='auto' and mean_time_between_interruptions_hours go together: the interval comes "
                "from the save cost and that mean time (e.g. ResumableCheckpoint(every_n_minutes='auto', "
                "mean_time_between_interruptions_hours=6))."
            )
        if auto and not mean_time_between_interruptions_hours > 0:  # type: ignore[operator]
            raise ConfigurationError(
                f"mean_time_between_interruptions_hours={mean_time_between_interruptions_hours} must be > 0."
            )
        if every_n_minutes is not None and not auto and not every_n_minutes > 0:  # type: ignore[operator]
            raise ConfigurationError(
                f"every_n_minutes={every_n_minutes} must be > 0; use None to save on steps or epochs only "
                "(ResumableCheckpoint(every_n_minutes=...))."
            )
        if keep_last_k is not None and keep_last_k < 1:
            raise ConfigurationError(
                f"keep_last_k={keep_last_k} must be >= 1 so the newest checkpoint survives; use None to keep all "
                "(ResumableCheckpoint(keep_last_k=...))."
            )
        if filename is not None and "/" in filename:
            raise ConfigurationError(
                f"filename={filename!r} must not contain '/'; put directories into dirpath instead."
            )
        only_time = every_n_minutes is not None and every_n_train_steps is None and every_n_epochs is None
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            mode=mode,
            verbose=verbose,
            save_last=save_last,
            save_top_k=save_top_k,
            every_n_train_steps=every_n_train_steps,
            every_n_epochs=0 if only_time else every_n_epochs,
            save_on_exception=save_on_exception,
            auto_insert_metric_name=auto_insert_metric_name,
            save_on_train_epoch_end=save_on_train_epoch_end,
            enable_version_counter=enable_version_counter,
        )
        self.every_n_minutes = every_n_minutes
        self.mean_time_between_interruptions_hours = mean_time_between_interruptions_hours
        self._cadence = AutoCadence(mean_time_between_interruptions_hours * 3600.0) if auto else None  # type: ignore[operator]
        self.async_save = async_save
        self.sharded = sharded
        self.local_cache_dir = local_cache_dir
        self._cache: CheckpointStore | None = None
        self._sharded = bool(sharded)
        self.keep_last_k = keep_last_k
        self.auto_resume = auto_resume
        self.data_state = data_state
        self.strict_resume = strict_resume
        self.wandb_resume = wandb_resume
        self._run_id: str | None = None
        self._generation = 0
        self._resumed_at: tuple[int, int] | None = None
        self._resume_info: ResumeInfo | None = None
        self._progress: ProgressMarker | None = None
        self._progress_from: int | None = None  # the step this fit's training started from
        self._trainer: pl.Trainer | None = None
        self._store: CheckpointStore | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._last_save_time = 0.0
        self.last_save_seconds: float | None = None
        """Wall time of the latest finished save, from building the state to the published manifest."""
        self.last_blocked_seconds: float | None = None
        """Time training waited for the latest save (with ``async_save``: gathering and copying the state)."""
        self.failed_saves = 0
        """Background saves that failed on this rank (each was reported when it happened)."""
        self._writer = BackgroundWriter()
        self._stager = HostStager()
        self._staged: tuple[int, dict[str, Any] | None, dict[str, Any]] | None = None
        self._synchronous = False
        self._checkpoint_writer: CheckpointWriter | None = None
        self._save_group: Any = None

    @staticmethod
    def of(trainer: pl.Trainer, needed_by: str) -> ResumableCheckpoint:
        """The Trainer's ``ResumableCheckpoint``; raises ``ValueError`` naming ``needed_by`` and the fix when none."""
        found = [cb for cb in trainer.callbacks if isinstance(cb, ResumableCheckpoint)]
        if not found:
            raise ConfigurationError(
                f"{needed_by} needs a ResumableCheckpoint among the Trainer's callbacks; add "
                "lightning_scale.callbacks.ResumableCheckpoint(dirpath=..., every_n_train_steps=...)."
            )
        return found[0]

    @property
    def store(self) -> CheckpointStore:
        """The checkpoint directory (available once ``setup`` resolved ``dirpath``)."""
        if self._store is None:
            if self.dirpath is None:
                raise RuntimeError("ResumableCheckpoint.dirpath is resolved in setup(); call this after it.")
            self._store = CheckpointStore(str(self.dirpath))
        return self._store

    @property
    def _files(self) -> CheckpointWriter:
        """Writes, uploads and removes this callback's checkpoint files (from ``setup`` on)."""
        if self._checkpoint_writer is None:
            raise RuntimeError("ResumableCheckpoint writes checkpoints once setup() resolved dirpath.")
        return self._checkpoint_writer

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = _default_dirpath(trainer)
        self._setup_format(trainer, stage)
        if stage == "fit":  # before ModelCheckpoint lists the directory, so that every rank fails alike
            self._store = CheckpointStore(str(self.dirpath))
            self._on_storage(self.store.check_writable)
            self._setup_cache()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)  # a non-empty directory is what resuming looks like
        self._store = CheckpointStore(str(self.dirpath))  # rank 0's dirpath, as ModelCheckpoint broadcast it
        if stage != "fit":
            return
        self._trainer = trainer
        self._checkpoint_writer = CheckpointWriter(self.store, self._cache, self._retain, self._plugin(trainer))
        self._on_storage(self._files.remove_partial_files, "Cleaning unfinished saves")
        self._run_id = distributed.broadcast_object(uuid.uuid4().hex)
        self._generation, self._resumed_at = 0, None
        self._progress, self._progress_from = ProgressMarker(self.store), None
        data_states = [cb for cb in trainer.callbacks if isinstance(cb, DataStateCheckpoint)]
        if self.data_state and not data_states:
            data_states = [DataStateCheckpoint()]
            trainer.callbacks.append(data_states[0])  # Lightning's setup loop reaches it next
        for data_state in data_states if self.strict_resume else []:
            data_state.strict = True
        wandb = any(isinstance(logger, WandbLogger) for logger in trainer.loggers)
        if self.wandb_resume and wandb and not any(isinstance(cb, WandbResume) for cb in trainer.callbacks):
            trainer.callbacks.append(WandbResume())
        if self.auto_resume:
            restore_from_when_unset(trainer, lambda: self._choose_resume_checkpoint(trainer))

    def _plugin(self, trainer: pl.Trainer) -> Callable[[dict[str, Any], str], None] | None:
        """The user's ``CheckpointIO`` plugin, which writes every single-file checkpoint (``None``: Lightning's)."""
        save_file = plugin_save_file(trainer.strategy)
        if save_file is not None and self._sharded:
            rank_zero_warn(
                "ResumableCheckpoint writes sharded checkpoints with torch.distributed.checkpoint, so the Trainer's "
                "CheckpointIO plugin does not write them. Pass sharded=False to have it write single files "
                "(strategies that shard the state need save_distributed_checkpoint=False too)."
            )
        return save_file

    def _setup_cache(self) -> None:
        if self.local_cache_dir is None:
            return
        self._cache = CheckpointStore(self.local_cache_dir)
        if not self._cache.is_local:
            raise ConfigurationError(f"local_cache_dir={self.local_cache_dir!r} must be a local directory (fast disk).")
        if self._sharded:
            raise ConfigurationError(
                "ResumableCheckpoint(local_cache_dir=...) stages single files on rank 0's disk; sharded checkpoints "
                "are written by every rank: drop local_cache_dir, or save single files (sharded=False)."
            )
        self._on_storage(self._cache.check_writable)

    def _setup_format(self, trainer: pl.Trainer, stage: str) -> None:
        native = writes_sharded_checkpoints(trainer.strategy)  # its state dict holds shards; it loads directories
        self._sharded = native if self.sharded is None else self.sharded
        name = type(trainer.strategy).__name__
        if stage == "fit" and native and not self._sharded:
            raise ConfigurationError(
                f"ResumableCheckpoint(sharded=False) writes one file, but {name} shards the state. Use sharded=True "
                "(the default for it), or save_distributed_checkpoint=False on the strategy to gather the full state "
                "on rank 0 (--trainer.strategy.save_distributed_checkpoint false)."
            )
        if stage == "fit" and native and self.async_save:
            raise ConfigurationError(
                f"ResumableCheckpoint(async_save=True) writes single files, but {name} shards the state: pass "
                "save_distributed_checkpoint=False to the strategy, or drop async_save."
            )
        if native and not CheckpointStore(str(self.dirpath)).is_local:
            raise ConfigurationError(
                f"{name} loads sharded checkpoints from local disk only; dirpath={self.dirpath!r} is not local. Use a "
                "local (or mounted shared) directory, or save_distributed_checkpoint=False on the strategy."
            )
        if self._sharded and not native and not isinstance(trainer.strategy.checkpoint_io, ShardedAwareCheckpointIO):
            trainer.strategy.checkpoint_io = ShardedAwareCheckpointIO(trainer.strategy.checkpoint_io)
        if stage == "fit" and self._sharded and self.async_save and self._save_group is None:
            self._save_group = distributed.new_group("gloo")  # the writer threads' collectives, apart from training's

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._finish_background_saves(trainer)
        self._writer.close()
        self._stager.clear()
        distributed.destroy_group(self._save_group)
        self._save_group = None
        super().teardown(trainer, pl_module, stage)
        self._trainer = None

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._finish_background_saves(trainer)
        self._record_progress(trainer, force=True)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._finish_background_saves(trainer)  # the save in flight holds a valid earlier state: let it land
        self._record_progress(trainer, force=True)

    def _record_progress(self, trainer: pl.Trainer, force: bool = False) -> None:
        """Rank 0 records the step, once this fit has trained one (a failed start keeps the last attempt's record)."""
        started = self._progress_from is not None and trainer.global_step > self._progress_from
        if trainer.is_global_zero and self._progress is not None and started:
            self._progress.record(trainer.global_step, force=force)

    def _on_storage(self, fn: Callable[[], T], what: str = "", every_rank: bool = False) -> T:
        """Run storage work on rank 0 (or every rank) and raise ``CheckpointStorageError`` on all ranks if it fails."""
        try:
            return distributed.on_every_rank(fn) if every_rank else distributed.on_rank_zero(fn)
        except distributed.RankFailedError as err:
            if isinstance(err.__cause__, CheckpointStorageError):
                raise err.__cause__ from err
            raise (UnusableStorageError if isinstance(err, UsageError) else CheckpointStorageError)(
                f"{what or 'Checkpoint storage'} failed ({err}) in {self.dirpath}. Earlier checkpoints are untouched; "
                "check the storage (space, permissions, credentials) and re-run to resume."
            ) from err

    def _choose_resume_checkpoint(self, trainer: pl.Trainer) -> str | None:
        if trainer.global_step > 0:
            return None  # a second fit on this Trainer continues from memory, which is at least as new
        path, manifest = self._on_storage(lambda: _newest_resumable(self.store), "Looking for a checkpoint")
        if path is None:
            rank_zero_info(f"No valid checkpoint in {self.dirpath}: starting from scratch.")
            return None
        if manifest is None:
            return path  # written by a stock ModelCheckpoint: no manifest to check it against or to show
        _check_same_model(manifest, trainer.lightning_module, path)
        if trainer.is_global_zero:  # for the banner at on_train_start, once every callback has restored its state
            last_seen = self._progress.last_step() if self._progress is not None else None
            age_s = time.time() - manifest.created_unix
            self._resume_info = ResumeInfo(path, manifest.global_step, manifest.epoch, age_s, last_seen)
        return path

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._progress_from = trainer.global_step
        if self._resume_info is not None:  # rank 0; Lightning runs checkpoint callbacks' hooks last: costs are in
            trackers = [cb for cb in trainer.callbacks if isinstance(cb, CostTracker)]
            rank_zero_info(self._resume_info.banner(trackers[0].resume_summary() if trackers else None))
            self._resume_info = None
        self._last_save_time = self._clock()
        position = self._resumed_at or (self._generation, trainer.global_step)
        newer, top_generation = self._on_storage(lambda: _newer_checkpoints(self.store, position), "Listing")
        if newer:
            self._generation = top_generation + 1
            shown = ", ".join(newer[:3]) + (f" and {len(newer) - 3} more" if len(newer) > 3 else "")
            rank_zero_warn(
                f"{self.dirpath} holds checkpoints newer than the state this fit starts from ({shown}). They are "
                f"kept, but this run's checkpoints (generation {self._generation}) supersede them on resume."
            )

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: STEP_OUTPUT,
        batch: Any,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._record_progress(trainer, force=self._last_global_step_saved == trainer.global_step)
        if self.every_n_minutes is None:
            return
        interval = self._interval_seconds()
        if self._cadence is not None and trainer_logs_this_step(trainer):
            pl_module.log("checkpoint/interval_minutes", interval / 60.0, on_step=True, on_epoch=False)
            pl_module.log("checkpoint/save_seconds", self._cadence.save_seconds, on_step=True, on_epoch=False)
        elapsed = self._clock() - self._last_save_time
        if not distributed.any_rank(elapsed >= interval):
            return
        self._last_save_time = self._clock()  # also when top-k declines, so the next try is a full interval away
        if not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def _interval_seconds(self) -> float:
        if self._cadence is not None:
            return self._cadence.interval_seconds()
        return timedelta(minutes=float(self.every_n_minutes)).total_seconds()  # type: ignore[arg-type]

    @property
    def save_in_flight(self) -> bool:
        """Whether a background save of this rank (``async_save``) is still being written."""
        return self._writer.busy

    def newest_valid_checkpoint(self) -> str | None:
        """Path of the newest valid checkpoint in ``dirpath`` (``None``: none); call on every rank (rank 0 looks)."""
        manifest, _ = self._on_storage(lambda: find_newest_valid(self.store), "Looking for a checkpoint")
        return None if manifest is None else self.store.url(manifest.name)

    def save_now(self, trainer: pl.Trainer) -> str:
        """Save a checkpoint of the current step now, whatever the triggers say; call on every rank.

        Used on preemption. Returns the checkpoint's path once it is durable; when this step is already saved, returns
        that one. With ``async_save`` it first waits for the save in flight.
        """
        failed = self._finish_background_saves(trainer)
        latest_failed = distributed.any_rank(self._last_checkpoint_saved in failed)  # known where it was written
        if self._last_global_step_saved == trainer.global_step and self._last_checkpoint_saved and not latest_failed:
            return self._last_checkpoint_saved
        candidates = self._monitor_candidates(trainer)
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer)
        self._synchronous = True
        try:
            self._save_checkpoint(trainer, filepath)
        finally:
            self._synchronous, self._staged = False, None
        return filepath

    @override
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        try:
            super()._save_last_checkpoint(trainer, monitor_candidates)  # may reuse the state staged for top-k
        finally:
            self._staged = None  # the host copy lives only in the writer's queue from here on

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self._sharded:
            self._save_sharded(trainer, filepath)
            return
        if self.async_save and not self._synchronous:
            self._save_in_background(trainer, filepath)
            return
        started = self._clock()
        name = self._name_in_dir(filepath)
        if self._cache is not None:
            self._finish_background_saves(trainer)  # at most one upload in flight
        checkpoint = dump_checkpoint(trainer, self.save_weights_only)  # on every rank: it gathers the full state
        fields = self._manifest_fields(trainer, checkpoint)
        self._on_storage(lambda: self._files.write(checkpoint, name, fields), f"Saving checkpoint {name}")
        uploading = self._cache is not None and not self._synchronous
        if self._cache is not None and self._synchronous:  # save_now: durable in dirpath before it returns
            self._on_storage(lambda: self._files.upload(name), f"Uploading checkpoint {name}")
        elif uploading and trainer.is_global_zero:
            self._writer.submit(lambda: self._upload_in_background(name, started), what=filepath)
        self._saved_synchronously(trainer, filepath, started, durable=not uploading)

    def _save_sharded(self, trainer: pl.Trainer, filepath: str) -> None:
        """Every rank writes its shards in parallel; rank 0 then publishes the manifest of all files."""
        started = self._clock()
        name = self._name_in_dir(filepath)
        checkpoint = dump_checkpoint(trainer, self.save_weights_only)
        native = writes_sharded_checkpoints(trainer.strategy)
        try:
            self._files.write_sharded(checkpoint, name, self._manifest_fields(trainer, checkpoint), native, group=None)
        except Exception as err:  # raised on every rank alike
            raise CheckpointStorageError(
                f"Saving sharded checkpoint {name} failed ({type(err).__name__}: {err}) in {self.dirpath}. Earlier "
                "checkpoints are untouched; check the storage (space, permissions, credentials) and re-run to resume."
            ) from err
        self._saved_synchronously(trainer, filepath, started)

    def _saved_synchronously(self, trainer: pl.Trainer, filepath: str, started: float, durable: bool = True) -> None:
        self._saved(trainer, filepath, started)
        if not durable:
            return  # its upload reports when it is
        self.last_save_seconds = self.last_blocked_seconds
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def _save_in_background(self, trainer: pl.Trainer, filepath: str) -> None:
        """Stage the state in host memory (every rank takes part in gathering it) and queue rank 0's write."""
        started = self._clock()
        if self._staged is None or self._staged[0] != trainer.global_step:
            self._finish_background_saves(trainer)  # at most one state in flight
            checkpoint = dump_checkpoint(trainer, self.save_weights_only)
            writes = trainer.is_global_zero or self._sharded  # sharded: every rank writes its part
            staged = self._stager.copy(checkpoint) if writes else None
            self._staged = (trainer.global_step, staged, self._manifest_fields(trainer, checkpoint))
        _, staged, fields = self._staged
        if staged is not None:
            name = self._name_in_dir(filepath)
            self._writer.submit(lambda: self._write_in_background(staged, name, fields, started), what=filepath)
        self._saved(trainer, filepath, started)

    def _upload_in_background(self, name: str, started: float) -> None:
        try:
            self._files.upload(name)
        except Exception as err:
            rank_zero_warn(
                f"Uploading checkpoint {name} to {self.dirpath} failed ({type(err).__name__}: {err}). Its local copy "
                f"stays in {self.local_cache_dir}; the previous valid checkpoint in dirpath stays the one to resume "
                "from. Training goes on and the next upload tries again."
            )
            raise
        self.last_save_seconds = self._clock() - started

    def _write_in_background(self, staged: dict[str, Any], name: str, fields: dict[str, Any], started: float) -> None:
        """Runs on the writer thread: rank 0's single file, or every rank's shards over the writers' own group."""
        try:
            if self._sharded:
                self._files.write_sharded(staged, name, fields, native=False, group=self._save_group)
            else:
                self._files.write(staged, name, fields)
                if self._cache is not None:
                    self._files.upload(name)
        except Exception as err:
            rank_zero_warn(
                f"The background save of checkpoint {name} to {self.dirpath} failed ({type(err).__name__}: {err}). "
                "It was not published; the previous valid checkpoint stays the one to resume from. Training goes on "
                "and the next save tries again."
            )
            raise
        self.last_save_seconds = self._clock() - started

    def _finish_background_saves(self, trainer: pl.Trainer) -> list[str]:
        """Wait for this rank's saves in flight; return the paths of those that failed (reported already)."""
        results = self._writer.wait()
        failed = [result.what for result in results if result.error is not None]
        self.failed_saves += len(failed)
        if len(failed) < len(results) and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
        return failed

    def _saved(self, trainer: pl.Trainer, filepath: str, started: float) -> None:
        """Bookkeeping shared by both save paths, on every rank, once training may go on."""
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        self._last_save_time = self._clock()
        self.last_blocked_seconds = self._last_save_time - started
        if self._cadence is not None:
            before = self._cadence.interval_seconds()
            self._cadence.record(self.last_blocked_seconds)
            if abs(self._cadence.interval_seconds() - before) > 0.1 * before:
                rank_zero_info(
                    f"ResumableCheckpoint: saving every {self._cadence.interval_seconds() / 60:.1f} min (save "
                    f"{self._cadence.save_seconds:.2f} s, {self.mean_time_between_interruptions_hours} h between "
                    "interruptions; Young/Daly)"
                )

    def _manifest_fields(self, trainer: pl.Trainer, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "run_id": str(self._run_id),
            "generation": self._generation,
            "world_size": trainer.world_size,
            "tensor_shapes": _tensor_shapes(checkpoint["state_dict"]),  # the saved model's (a pipeline's gathered)
        }

    def _retain(self) -> None:
        try:
            self._apply_retention()
        except OSError as err:  # the new checkpoint is safe; an old one stays until the next save retries
            warnings.warn(f"Removing old checkpoints from {self.dirpath} failed ({err}); they are kept.", stacklevel=2)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            self._files.remove(self._name_in_dir(filepath))

    @override
    def _save_none_monitor_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """Save as ``ModelCheckpoint`` does without a monitor, but leave the previous checkpoint to ``keep_last_k``."""
        filepath = self._get_metric_interpolated_filepath_name(monitor_candidates, trainer)
        self.best_model_path = filepath  # before saving: it is part of the state
        self._save_checkpoint(trainer, filepath)

    def _apply_retention(self) -> None:
        if self.keep_last_k is None or self.monitor is not None or self.save_top_k == -1:
            return
        last = self._name_in_dir(self.last_model_path) if self.last_model_path else None
        manifests, _ = list_manifests(self.store)
        ours = [
            m
            for m in manifests
            if m.run_id == self._run_id and m.generation == self._generation and m.name != last
            and not m.name.endswith(PREVIOUS_SUFFIX)
        ]  # fmt: skip
        for manifest in ours[self.keep_last_k :]:
            self._files.remove(manifest.name)

    def _name_in_dir(self, filepath: str) -> str:
        return str(filepath).rstrip("/").rsplit("/", 1)[-1]

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        path, _ = _newest_resumable(CheckpointStore(str(self.dirpath or _default_dirpath(trainer))))
        return set() if path is None else {path}

    @override
    def state_dict(self) -> dict[str, Any]:
        step = self._trainer.global_step if self._trainer is not None else None
        return {
            **super().state_dict(),
            "version": STATE_VERSION,
            "run_id": self._run_id,
            "generation": self._generation,
            "global_step": step,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version(state_dict, "ResumableCheckpoint")
        super().load_state_dict(state_dict)
        self._run_id = state_dict.get("run_id", self._run_id)
        self._generation = state_dict.get("generation", 0)
        if state_dict.get("global_step") is not None:
            self._resumed_at = (self._generation, state_dict["global_step"])


def _newest_resumable(store: CheckpointStore) -> tuple[str | None, Manifest | None]:
    """The checkpoint to resume from and its manifest: the newest valid one with a manifest, else the newest complete
    training checkpoint that a stock ``ModelCheckpoint`` wrote (no manifest); warns about each newer one skipped."""
    manifest, skipped = find_newest_valid(store)
    path = None if manifest is None else store.url(manifest.name)
    if manifest is None:  # a run that switched from ModelCheckpoint: judge its files by their content
        name, unvouched = find_newest_unvouched(store)
        skipped = [line for line in skipped if not line.endswith(UNFINISHED)] + unvouched
        if name is not None:
            path = store.url(name)
            rank_zero_info(
                f"Resuming from {path}, which has no manifest (a stock ModelCheckpoint wrote it): it was checked as a "
                "complete training checkpoint instead. The checkpoints of this run carry manifests. Lightning may warn "
                "that the ModelCheckpoint callback is missing: its state (best and top-k paths) is not carried over."
            )
    for line in skipped:
        rank_zero_warn(f"Not resuming from {line}; looking for an older valid checkpoint.")
    return path, manifest


def _default_dirpath(trainer: pl.Trainer) -> str:
    return f"{str(trainer.default_root_dir).rstrip('/')}/checkpoints"


def _newer_checkpoints(store: CheckpointStore, position: tuple[int, int]) -> tuple[list[str], int]:
    """Checkpoints in ``store`` ahead of ``(generation, global_step)``, and the highest generation there."""
    manifests, _ = list_manifests(store)
    newer = [m.name for m in manifests if (m.generation, m.global_step) > position]
    return newer, max((m.generation for m in manifests), default=0)


def _tensor_shapes(state_dict: Mapping[str, Any]) -> dict[str, list[int]]:
    return {name: list(tensor.shape) for name, tensor in state_dict.items() if isinstance(tensor, torch.Tensor)}


def _check_same_model(manifest: Manifest, module: pl.LightningModule, path: str) -> None:
    if not manifest.tensor_shapes:
        return
    current = _tensor_shapes(module.state_dict())
    saved = manifest.tensor_shapes
    problems = [f"missing {k!r}" for k in sorted(saved.keys() - current.keys())]
    problems += [f"unexpected {k!r}" for k in sorted(current.keys() - saved.keys())]
    problems += [
        f"{k!r} has shape {current[k]} here but {saved[k]} in the checkpoint"
        for k in sorted(saved.keys() & current.keys())
        if list(saved[k]) != current[k]
    ]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ConfigurationError(
            f"The newest checkpoint {path} was written by a different model ({shown}). Nothing was loaded or "
            "deleted. Use a new dirpath for a new model, or ResumableCheckpoint(auto_resume=False) to start fresh."
        )
