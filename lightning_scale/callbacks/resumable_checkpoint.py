"""Atomic, validated, auto-resuming checkpoints: a drop-in subclass of Lightning's ``ModelCheckpoint``."""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal
from weakref import proxy

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import restore_from_when_unset
from lightning_scale.callbacks.data_state import DataStateCheckpoint
from lightning_scale.checkpoint.manifest import (
    Manifest,
    find_newest_valid,
    list_manifests,
    manifest_name,
    publish_checkpoint,
)
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore

__all__ = ["ResumableCheckpoint"]

log = logging.getLogger(__name__)


class ResumableCheckpoint(ModelCheckpoint):
    """Checkpoints that are atomic, validated on resume, pruned safely and resumed automatically.

    A subclass of Lightning's ``ModelCheckpoint``: ``monitor``/``save_top_k``, ``save_last`` and
    ``trainer.fit(ckpt_path="last")`` keep working. On top of it:

    - **triggers**: every ``every_n_train_steps`` and/or every ``every_n_minutes`` of wall time; the time decision is
      a vote of all ranks at the same step, so no rank saves alone and none waits forever;
    - **atomic**: each file is written under a temporary name, flushed (``fsync`` on local disk), renamed, and then
      vouched for by ``<name>.manifest.json`` holding its size and sha256; a partial or corrupt checkpoint is never
      chosen for resume, the newest valid one is, with a warning naming the bad file;
    - **retention**: ``keep_last_k`` newest checkpoints of this run are kept (with ``monitor`` set, the best
      ``save_top_k`` are kept as ``ModelCheckpoint`` does); the newest valid checkpoint is never deleted, and
      checkpoints of other runs in the same directory are never touched;
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
        every_n_minutes: Save when this many minutes of wall time passed since the last save (> 0).
        every_n_epochs: Save every this many epochs (default: every epoch when no other trigger is set).
        keep_last_k: Keep this many newest checkpoints of this run (``None`` keeps all). Used when ``monitor`` is
            ``None``.
        save_top_k: With ``monitor`` set, keep this many best checkpoints.
        save_last: Also maintain ``last.ckpt`` (``True``, or ``"link"`` for a symlink), as in ``ModelCheckpoint``.
        auto_resume: Resume from the newest valid checkpoint in ``dirpath`` when ``fit`` gets no ``ckpt_path``.
        data_state: Add a :class:`DataStateCheckpoint` to the Trainer when it has none.
        verbose: Log each save, as in ``ModelCheckpoint``.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> checkpoint = ResumableCheckpoint(dirpath="memory://run", every_n_train_steps=100, keep_last_k=2)
        >>> trainer = Trainer(callbacks=[checkpoint], logger=False, enable_progress_bar=False)
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        every_n_train_steps: int | None = None,
        every_n_minutes: float | None = None,
        every_n_epochs: int | None = None,
        keep_last_k: int | None = 3,
        save_top_k: int = 1,
        save_last: bool | Literal["link"] | None = None,
        auto_resume: bool = True,
        data_state: bool = True,
        verbose: bool = False,
    ) -> None:
        if every_n_minutes is not None and not every_n_minutes > 0:
            raise ValueError(
                f"every_n_minutes={every_n_minutes} must be > 0; use None to save on steps or epochs only "
                "(ResumableCheckpoint(every_n_minutes=...))."
            )
        if keep_last_k is not None and keep_last_k < 1:
            raise ValueError(
                f"keep_last_k={keep_last_k} must be >= 1 so the newest checkpoint survives; use None to keep all "
                "(ResumableCheckpoint(keep_last_k=...))."
            )
        if filename is not None and "/" in filename:
            raise ValueError(f"filename={filename!r} must not contain '/'; put directories into dirpath instead.")
        only_time = every_n_minutes is not None and every_n_train_steps is None and every_n_epochs is None
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            mode=mode,
            verbose=verbose,
            save_last=save_last,
            save_top_k=save_top_k if monitor is not None else -1,
            every_n_train_steps=every_n_train_steps,
            every_n_epochs=0 if only_time else every_n_epochs,
        )
        self.every_n_minutes = every_n_minutes
        self.keep_last_k = keep_last_k
        self.auto_resume = auto_resume
        self.data_state = data_state
        self._run_id: str | None = None
        self._store: CheckpointStore | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._last_save_time = 0.0

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
            self.dirpath = f"{trainer.default_root_dir.rstrip('/')}/checkpoints"
        self._store = CheckpointStore(str(self.dirpath))
        if stage == "fit":
            self._check_writable(trainer)  # before ModelCheckpoint lists the directory, so every rank fails alike
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)  # a non-empty directory is what resuming looks like
        if stage != "fit":
            return
        self._run_id = distributed.broadcast_object(uuid.uuid4().hex)
        if self.data_state and not any(isinstance(cb, DataStateCheckpoint) for cb in trainer.callbacks):
            data_state = DataStateCheckpoint()
            trainer.callbacks.append(data_state)
            data_state.setup(trainer, pl_module, stage)
        if self.auto_resume:
            restore_from_when_unset(trainer, lambda: self._choose_resume_checkpoint(trainer))

    def _check_writable(self, trainer: pl.Trainer) -> None:
        error = None
        if trainer.is_global_zero:
            try:
                self.store.check_writable()
            except CheckpointStorageError as err:
                error = str(err)
        error = distributed.broadcast_object(error)
        if error is not None:
            raise CheckpointStorageError(error)

    def _choose_resume_checkpoint(self, trainer: pl.Trainer) -> str | None:
        found: tuple[Manifest | None, list[str]] = (None, [])
        if trainer.is_global_zero:
            found = find_newest_valid(self.store)
        manifest, skipped = distributed.broadcast_object(found)
        for line in skipped:
            rank_zero_warn(f"Not resuming from {line}; looking for an older valid checkpoint.")
        if manifest is None:
            rank_zero_info(f"No valid checkpoint in {self.dirpath}: starting from scratch.")
            return None
        _check_same_model(manifest, trainer.lightning_module, self.store.url(manifest.name))
        self._run_id = manifest.run_id
        path = self.store.url(manifest.name)
        age_s = time.time() - manifest.created_unix
        rank_zero_info(
            f"Auto-resuming from {path} (global step {manifest.global_step}, epoch {manifest.epoch}, "
            f"written {age_s:.1f} s ago)."
        )
        return path

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_save_time = self._clock()

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
        if self.every_n_minutes is None:
            return
        elapsed = self._clock() - self._last_save_time
        due = distributed.any_rank(elapsed >= timedelta(minutes=self.every_n_minutes).total_seconds())
        if due and not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        name = self._name_in_dir(filepath)
        temporary = f".{name}.partial"
        trainer.save_checkpoint(self.store.url(temporary), self.save_weights_only)
        error = None
        if trainer.is_global_zero:
            try:
                publish_checkpoint(
                    self.store,
                    temporary,
                    name,
                    global_step=trainer.global_step,
                    epoch=trainer.current_epoch,
                    run_id=str(self._run_id),
                    world_size=trainer.world_size,
                    tensor_shapes=_tensor_shapes(trainer.lightning_module),
                )
                self._apply_retention()
            except OSError as err:
                error = f"Saving checkpoint {self.store.url(name)} failed: {type(err).__name__}: {err}"
        error = distributed.broadcast_object(error)
        if error is not None:
            raise CheckpointStorageError(error + ". Earlier checkpoints are untouched; check the storage.")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        self._last_save_time = self._clock()
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            self._remove(self._name_in_dir(filepath))

    def _remove(self, name: str) -> None:
        self.store.remove(manifest_name(name))  # first: a half-removed checkpoint is invalid, never trusted
        self.store.remove(name)

    def _apply_retention(self) -> None:
        if self.keep_last_k is None or self.monitor is not None:
            return
        protected = {self._name_in_dir(p) for p in (self.best_model_path, self.last_model_path) if p}
        manifests, _ = list_manifests(self.store)
        ours = [m for m in manifests if m.run_id == self._run_id]
        for manifest in ours[self.keep_last_k :]:
            if manifest.name not in protected:
                self._remove(manifest.name)

    def _name_in_dir(self, filepath: str) -> str:
        return str(filepath).rstrip("/").rsplit("/", 1)[-1]

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        manifest, skipped = find_newest_valid(self.store)
        for line in skipped:
            rank_zero_warn(f"Not resuming from {line}; looking for an older valid checkpoint.")
        return set() if manifest is None else {self.store.url(manifest.name)}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "run_id": self._run_id}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._run_id = state_dict.get("run_id", self._run_id)


def _tensor_shapes(module: pl.LightningModule) -> dict[str, list[int]]:
    return {name: list(tensor.shape) for name, tensor in module.state_dict().items()}


def _check_same_model(manifest: Manifest, module: pl.LightningModule, path: str) -> None:
    if not manifest.tensor_shapes:
        return
    current = _tensor_shapes(module)
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
        raise ValueError(
            f"The newest checkpoint {path} was written by a different model ({shown}). Nothing was loaded or "
            "deleted. Use a new dirpath for a new model, or ResumableCheckpoint(auto_resume=False) to start fresh."
        )
