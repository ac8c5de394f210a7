"""Atomic, validated, auto-resuming checkpoints: a drop-in subclass of Lightning's ``ModelCheckpoint``.

The Lightning glue only: when to save and what (Lightning's checkpoint of the Trainer). How files are written is
:mod:`lightning_scale.checkpoint.saver`'s, through the overrides of ``ModelCheckpoint``'s save path in
``_checkpoint_save_path``; the time trigger is ``_checkpoint_timer``'s; the run's identity and the resume choice are
``_checkpoint_lineage``'s, the format choice ``_checkpoint_format``'s.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import restore_from_when_unset
from lightning_scale._process_local import ProcessLocal
from lightning_scale._trainer_attributes import trainer_callbacks
from lightning_scale.callbacks._checkpoint_arguments import (
    check_where_and_when,
    checked_every_n_minutes,
    default_dirpath,
    name_in_dir,
)
from lightning_scale.callbacks._checkpoint_companions import add_companions
from lightning_scale.callbacks._checkpoint_format import choose_format, local_cache
from lightning_scale.callbacks._checkpoint_io import plugin_save_file
from lightning_scale.callbacks._checkpoint_lineage import RunLineage
from lightning_scale.callbacks._checkpoint_save_path import SavePath
from lightning_scale.callbacks._checkpoint_snapshots import MemoryResume, memory_snapshots
from lightning_scale.callbacks._checkpoint_timer import TimeTrigger
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.callbacks._state_key import settings_state_key
from lightning_scale.callbacks._step_vote import StepVote
from lightning_scale.checkpoint.journal import RunJournal
from lightning_scale.checkpoint.rank_zero import on_storage
from lightning_scale.checkpoint.saver import SaveHooks, Saver, make_saver
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.checkpoint.writer import CheckpointWriter
from lightning_scale.errors import ConfigurationError, UsageError
from lightning_scale.snapshot import SnapshotCadence

__all__ = ["ResumableCheckpoint"]


class ResumableCheckpoint(ProcessLocal, SavePath):
    """Checkpoints that are atomic, validated on resume, pruned safely and resumed automatically.

    A subclass of Lightning's ``ModelCheckpoint`` (its arguments keep their meaning; the documentation's
    "Differences from the stock classes" lists what differs), with step and time triggers (the Young/Daly interval
    with ``every_n_minutes="auto"``), asynchronous and sharded saves, atomic files vouched for by a manifest,
    retention and generations, any fsspec URL, auto-resume of the full state (a :class:`DataStateCheckpoint` adds
    every rank's data and RNG state), memory snapshots in node-local shared memory for the fastest restarts, and the
    run's journal for ``lightning-scale report``. The documentation's ResumableCheckpoint page details each.

    Logged metrics (with ``every_n_minutes``): ``checkpoint/interval_minutes`` (the interval in use) and
    ``checkpoint/save_seconds`` (the measured save time ``C`` of the Young/Daly interval).

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
        snapshot_every_n_steps: Take a memory snapshot every this many optimizer steps, ``"auto"`` (as often as
            ``snapshot_max_overhead`` allows, at least the Young/Daly interval when
            ``mean_time_between_interruptions_hours`` is given), or ``None`` (none).
        snapshot_max_overhead: The share of step time that ``"auto"`` memory snapshots may take.
        local_cache_dir: A local directory that absorbs each save (training waits for the local copy only); rank 0
            then uploads it to ``dirpath`` on its writer thread, at most one upload in flight. Single files only.
        async_save: Write checkpoints on a background thread; training waits only for a host-memory copy of the
            state. ``C`` of the automatic cadence is then that blocked time.
        sharded: Save each checkpoint as a directory of per-rank shards (``None``: when the strategy shards the
            state). With ``async_save``, every rank writes its shards on its writer thread, over a process group of
            its own (gloo).
        keep_last_k: Keep this many newest checkpoints of this run (``None`` keeps all). Used when ``monitor`` is
            ``None`` and ``save_top_k`` is 1.
        save_top_k: As in ``ModelCheckpoint`` (loggers see it): with ``monitor``, the best this many; without, ``0``
            saves ``last.ckpt`` only, ``-1`` keeps all, ``1`` (the default) the ``keep_last_k`` newest.
        save_last: Also maintain ``last.ckpt`` (``True``, or ``"link"`` for a symlink), as in ``ModelCheckpoint``.
        auto_resume: Resume from the newest valid checkpoint in ``dirpath`` when ``fit`` gets no ``ckpt_path``.
        data_state: Add a :class:`DataStateCheckpoint` when the Trainer has none (exact data resume; opt out with
            your own ``DataStateCheckpoint(make_loaders_resumable=False)``).
        strict_resume: Refuse to train when the training data cannot resume exactly (default: a warning).
        wandb_resume: Add a :class:`WandbResume` beside a ``WandbLogger`` when missing: a restart continues the run.
        verbose: Log each save, as in ``ModelCheckpoint``.
        save_on_exception: Also save when fit raises, as in ``ModelCheckpoint``.
        save_weights_only: Refused when ``True`` (such files cannot resume; add a stock ``ModelCheckpoint`` for them).
        auto_insert_metric_name: As in ``ModelCheckpoint``.
        train_time_interval: ``ModelCheckpoint``'s name for ``every_n_minutes`` (a ``timedelta``).
        save_on_train_epoch_end: As in ``ModelCheckpoint``.
        enable_version_counter: As in ``ModelCheckpoint`` (``-v1`` names when a name is taken).

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> checkpoint = ResumableCheckpoint(dirpath="memory://run", every_n_train_steps=100, keep_last_k=2)
        >>> trainer = Trainer(callbacks=[checkpoint], logger=False, enable_progress_bar=False)
    """

    METRIC_KEYS = ("checkpoint/interval_minutes", "checkpoint/save_seconds")
    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {
        "_saver": None, "_trainer": None, "_store": None, "_timer": None, "journal": None,
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
        snapshot_every_n_steps: int | Literal["auto"] | None = "auto",
        snapshot_max_overhead: float = 0.01,
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
        every_n_minutes = checked_every_n_minutes(
            filename=filename, monitor=monitor, every_n_minutes=every_n_minutes,
            mean_time_between_interruptions_hours=mean_time_between_interruptions_hours,
            train_time_interval=train_time_interval, keep_last_k=keep_last_k, save_top_k=save_top_k,
            save_weights_only=save_weights_only,
        )  # fmt: skip
        check_where_and_when(dirpath, every_n_train_steps, every_n_epochs, every_n_minutes)
        only_time = every_n_minutes is not None and every_n_train_steps is None and every_n_epochs is None
        super().__init__(
            dirpath=dirpath, filename=filename, monitor=monitor, mode=mode, verbose=verbose, save_last=save_last,
            save_top_k=save_top_k, every_n_train_steps=every_n_train_steps,
            every_n_epochs=0 if only_time else every_n_epochs, save_on_exception=save_on_exception,
            auto_insert_metric_name=auto_insert_metric_name, save_on_train_epoch_end=save_on_train_epoch_end,
            enable_version_counter=enable_version_counter,
        )  # fmt: skip
        self.every_n_minutes = every_n_minutes
        self.mean_time_between_interruptions_hours = mean_time_between_interruptions_hours
        self.async_save = async_save
        self.sharded = sharded
        self.local_cache_dir = local_cache_dir
        self.keep_last_k = keep_last_k
        self.auto_resume = auto_resume
        self.data_state = data_state
        self.strict_resume = strict_resume
        self.wandb_resume = wandb_resume
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.snapshot_max_overhead = snapshot_max_overhead
        self._lineage = RunLineage()
        self._snapshots = memory_snapshots(
            snapshot_every_n_steps, snapshot_max_overhead, mean_time_between_interruptions_hours, self._lineage
        )
        self._trainer: pl.Trainer | None = None
        self._store: CheckpointStore | None = None
        self._saver: Saver | None = None
        self._timer: TimeTrigger | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._synchronous = False
        self._failed: list[str] = []  # names of the background saves found failed at the last collection
        self.last_save_seconds: float | None = None
        """Wall time of the latest finished save, from building the state to the published manifest."""
        self.last_blocked_seconds: float | None = None
        """Time training waited for the latest save (with ``async_save``: gathering and copying the state)."""
        self.failed_saves = 0
        """Background saves that failed on this rank (each was reported when it happened)."""
        self.journal: RunJournal | None = None
        """The run's journal in ``dirpath`` (attempts, checkpoints, preemptions, hangs), for ``lightning-scale report``;
        set up with the fit."""

    @staticmethod
    def of(trainer: pl.Trainer, needed_by: str) -> ResumableCheckpoint:
        """The Trainer's ``ResumableCheckpoint``; raises ``ValueError`` naming ``needed_by`` and the fix when none."""
        found = [cb for cb in trainer_callbacks(trainer) if isinstance(cb, ResumableCheckpoint)]
        if not found:
            raise ConfigurationError(
                f"{needed_by} needs a ResumableCheckpoint among the Trainer's callbacks; add "
                "lightning_scale.callbacks.ResumableCheckpoint(dirpath=..., every_n_train_steps=...)."
            )
        return found[0]

    @property
    @override
    def state_key(self) -> str:  # ModelCheckpoint's key, formatted once (tests/callbacks/test_state_key.py)
        return settings_state_key(self, self._generate_state_key, monitor=self.monitor, mode=self.mode,
                                  every_n_train_steps=self._every_n_train_steps, every_n_epochs=self._every_n_epochs,
                                  train_time_interval=self._train_time_interval)  # fmt: skip

    @property
    def store(self) -> CheckpointStore:
        """The checkpoint directory (available once ``setup`` resolved ``dirpath``)."""
        if self._store is None:
            if self.dirpath is None:
                raise RuntimeError("ResumableCheckpoint.dirpath is resolved in setup(); call this after it.")
            self._store = CheckpointStore(str(self.dirpath))
        return self._store

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = default_dirpath(trainer)
        fmt = choose_format(trainer.strategy, self.sharded, self.async_save, str(self.dirpath), stage == "fit")
        cache = None
        distributed.destroy_process_group_at_exit()  # a gloo group alive at exit can abort a finished rank (exit -6)
        if stage == "fit":  # before ModelCheckpoint lists the directory, so that every rank fails alike
            self._store = CheckpointStore(str(self.dirpath))
            cache = local_cache(self.local_cache_dir, fmt.sharded)
            for store in [self.store, *([cache] if cache else [])]:
                on_storage(store.check_writable, "Checkpoint storage", str(self.dirpath))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)  # a non-empty directory is what resuming looks like
        self._store = CheckpointStore(str(self.dirpath))  # rank 0's dirpath, as ModelCheckpoint broadcast it
        if stage != "fit":
            return
        self._trainer = trainer
        self.journal = RunJournal(self.store, trainer.global_rank)
        files = CheckpointWriter(self.store, cache, self._retain, plugin_save_file(trainer.strategy, fmt.sharded))
        on_storage(files.remove_partial_files, "Cleaning unfinished saves", str(self.dirpath))
        hooks = SaveHooks(durable=self._durable, landed=self._landed, warn=rank_zero_warn, clock=self._clock)
        self._saver = make_saver(files, hooks, fmt.sharded, fmt.native, self.async_save)
        if self.every_n_minutes is not None and self._timer is None:
            mtbi_hours = self.mean_time_between_interruptions_hours
            self._timer = TimeTrigger(self.every_n_minutes, mtbi_hours, self._clock, owner=self)
        if self._timer is not None:
            self._timer.join(trainer)
        self._lineage.begin(self.store)
        if self._snapshots is not None:
            self._snapshots.setup(trainer, str(self.dirpath))
        add_companions(trainer, self.data_state, self.strict_resume, self.wandb_resume)
        if self.auto_resume:
            restore_from_when_unset(trainer, lambda: self._lineage.choose_resume(trainer, self._from_memory(trainer)))

    def _from_memory(self, trainer: pl.Trainer) -> Callable[[tuple[int, int] | None], MemoryResume | None] | None:
        snapshots = self._snapshots
        return None if snapshots is None else lambda durable: snapshots.choose(trainer, durable)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._snapshots is not None:
            self._snapshots.close(trainer)
        if self._saver is not None:
            self._saver.close()
            self._saver = None
        super().teardown(trainer, pl_module, stage)
        StepVote.of(trainer).leave(self)
        self._trainer = None

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._saving.finish()
        self._lineage.record_progress(trainer, final=True)
        self._journal(trainer, "end", reason="finished")
        if self._snapshots is not None:
            self._snapshots.finish(trainer)  # training is over: no restart needs them

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        if self._saver is not None:
            self._saver.finish()  # the save in flight holds a valid earlier state: let it land
        self._lineage.record_progress(trainer, final=True)
        reason = "usage_error" if isinstance(exception, UsageError) else "failed"
        self._journal(trainer, "end", reason=reason, error=f"{type(exception).__name__}: {str(exception)[:300]}")
        if self._snapshots is not None:
            self._snapshots.close(trainer)  # they stay in memory for the restart

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._lineage.start_training(trainer)
        resumed = None if trainer.ckpt_path is None else str(trainer.ckpt_path)
        self._journal(trainer, "start", world_size=trainer.world_size, nodes=trainer.num_nodes, resumed_from=resumed)
        if self._timer is not None:
            self._timer.restart()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        if self._snapshots is not None:
            self._snapshots.on_train_batch_end(trainer, outputs, batch_idx)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._lineage.record_progress(trainer, force=self._last_global_step_saved == trainer.global_step)
        if self._timer is None or not self._timer.fires(trainer, pl_module, outputs, batch_idx):
            return
        if not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    @property
    def snapshot_cadence(self) -> SnapshotCadence | None:
        """How far apart memory snapshots are (``None``: off): ``steps()`` is the number of steps the cadence gives
        now (chosen from the measured costs with ``"auto"``), ``every_n_steps`` a fixed number, which may be set."""
        return None if self._snapshots is None else self._snapshots.cadence

    @property
    def last_snapshot_seconds(self) -> float | None:
        """Time training waited for this rank's latest memory snapshot (``None``: none taken)."""
        return None if self._snapshots is None else self._snapshots.last_seconds

    @property
    def save_in_flight(self) -> bool:
        """Whether a background save of this rank (``async_save``) is still being written."""
        return self._saver is not None and self._saver.busy

    def discard_snapshots(self) -> None:
        """Forget this node's memory snapshots (the state being trained was replaced, e.g. by a rollback)."""
        if self._snapshots is not None:
            self._snapshots.discard()

    def newest_valid_checkpoint(self) -> str | None:
        """Path of the newest valid checkpoint in ``dirpath`` (``None``: none); call on every rank (rank 0 looks)."""
        return self._lineage.newest_valid()

    def save_now(self, trainer: pl.Trainer, again: bool = False) -> str:
        """Save a checkpoint of the current step now, whatever the triggers say; call on every rank.

        Used on preemption. Returns the checkpoint's path once it is durable; when this step is already saved, returns
        that one, unless ``again``: then the step is saved anew, with what changed since (a callback's state), and
        the earlier copy stays valid until the new one is published. With ``async_save`` it first waits for the save
        in flight.
        """
        self._saving.finish()
        latest = self._last_checkpoint_saved
        latest_failed = distributed.any_rank(bool(latest) and name_in_dir(latest) in self._failed)
        if self._last_global_step_saved == trainer.global_step and latest and not latest_failed and not again:
            return latest
        # saved anew under its own name (the earlier copy set aside until then), not as a second checkpoint "-v1"
        replaced = latest if again and self._last_global_step_saved == trainer.global_step else None
        filepath = self._get_metric_interpolated_filepath_name(self._monitor_candidates(trainer), trainer, replaced)
        self._synchronous = True
        try:
            self._save_checkpoint(trainer, filepath)
        finally:
            self._synchronous = False
            self._saving.forget_staged()
        return filepath

    def release_memory_snapshots(self, trainer: pl.Trainer) -> None:
        """Remove the job's memory snapshots from every node; call on every rank once its newest state is durable (a
        preemption's checkpoint): the job is leaving these machines, and one that stays up gets its memory back."""
        if self._snapshots is not None:
            self._snapshots.finish(trainer)

    def attempt_ends(self, trainer: pl.Trainer, timeout_s: float) -> None:
        """This attempt ends at the current step without Lightning's end hooks (a preemption's exit): its progress
        record says so, and the next attempt's banner counts the steps lost exactly. Waits at most ``timeout_s``
        for a slow store (the write goes on in the background)."""
        writer = threading.Thread(
            target=self._lineage.record_progress, args=(trainer,), kwargs={"final": True}, daemon=True
        )
        writer.start()
        writer.join(timeout_s)

    @override
    def state_dict(self) -> dict[str, Any]:
        step = self._trainer.global_step if self._trainer is not None else None
        return {**super().state_dict(), "version": STATE_VERSION, **self._lineage.state_dict(), "global_step": step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version(state_dict, "ResumableCheckpoint")
        super().load_state_dict(state_dict)
        self._lineage.load_state_dict(state_dict)
