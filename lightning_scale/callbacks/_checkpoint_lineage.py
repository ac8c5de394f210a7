"""Which run and generation a fit's checkpoints belong to, which checkpoint it resumes from, and how far it got:
the run-identity half of ``ResumableCheckpoint``, beside its saving half."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_scale import distributed
from lightning_scale._process_local import ProcessLocal
from lightning_scale._trainer_attributes import trainer_callbacks
from lightning_scale.checkpoint.progress import ProgressMarker, ResumeInfo
from lightning_scale.checkpoint.rank_zero import on_storage
from lightning_scale.checkpoint.resume import (
    ResumeChoice,
    check_same_model,
    choose_resume,
    expired,
    newer_checkpoints,
    tensor_shapes,
)
from lightning_scale.checkpoint.store import CheckpointStore

if TYPE_CHECKING:
    from lightning_scale.callbacks._checkpoint_snapshots import MemoryResume

__all__ = ["RunLineage", "reported"]

T = TypeVar("T")


@runtime_checkable
class SummarisesResume(Protocol):
    """A callback with a line for the resume banner (``CostTracker``: the cost so far and what was lost)."""

    def resume_summary(self) -> str | None: ...


class RunLineage(ProcessLocal):
    """A run's id (one per fit, the same on every rank), its generation (one more than the newest in the directory
    when the fit starts behind newer checkpoints, so that the next auto-resume prefers this run's), the position it
    resumed from, and the progress marker rank 0 keeps."""

    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {"_store": None, "_progress": None}

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.generation = 0
        self._resumed_at: tuple[int, int] | None = None  # (generation, global step) of the restored checkpoint
        self._resume_info: ResumeInfo | None = None  # rank 0, until the banner is printed
        self._store: CheckpointStore | None = None
        self._progress: ProgressMarker | None = None
        self._progress_from: int | None = None  # the step this fit's training started from

    def begin(self, store: CheckpointStore) -> None:
        """A fit starts on every rank: a new run id, generation 0 until the directory says otherwise."""
        self._store = store
        self.run_id = distributed.broadcast_object(uuid.uuid4().hex)
        self.generation, self._resumed_at = 0, None
        self._progress, self._progress_from = ProgressMarker(store), None

    @property
    def store(self) -> CheckpointStore:
        if self._store is None:
            raise RuntimeError("RunLineage.begin() sets the checkpoint directory at setup of fit.")
        return self._store

    def choose_resume(
        self, trainer: pl.Trainer, memory: Callable[[tuple[int, int] | None], MemoryResume | None] | None = None
    ) -> str | None:
        """The checkpoint a fit started without ``ckpt_path`` resumes from (every rank; ``None``: from scratch).

        ``memory(durable)``, called on every rank with the ``(generation, step)`` of the newest durable checkpoint
        (``None``: none with a manifest), returns a memory snapshot to resume from instead, if one is as new."""
        if trainer.global_step > 0:
            return None  # a second fit on this Trainer continues from memory, which is at least as new
        choice = self._on_storage(lambda: reported(choose_resume(self.store)), "Looking for a checkpoint")
        durable = None if choice.manifest is None else (choice.manifest.generation, choice.manifest.global_step)
        resumed = memory(durable) if memory is not None else None
        if resumed is not None:
            header = resumed.header
            where = f"from rank {resumed.received_from}'s node" if resumed.received_from is not None else "on this node"
            self._banner(trainer, f"the memory snapshot of step {header.step} ({where})", header.step,
                         header.epoch, header.created_unix)  # fmt: skip
            return resumed.path
        if choice.path is None:
            rank_zero_info(f"No valid checkpoint in {self.store.dirpath}: starting from scratch.")
            return None
        if choice.manifest is None:
            return choice.path  # written by a stock ModelCheckpoint: no manifest to check it against or to show
        check_same_model(choice.manifest, tensor_shapes(trainer.lightning_module.state_dict()), choice.path)
        manifest = choice.manifest
        self._banner(trainer, choice.path, manifest.global_step, manifest.epoch, manifest.created_unix)
        return choice.path

    def _banner(self, trainer: pl.Trainer, source: str, step: int, epoch: int, created_unix: float) -> None:
        """Rank 0 keeps what it resumes from for the banner at ``on_train_start`` (once every callback restored its
        state)."""
        if trainer.is_global_zero:
            last_seen = self._progress.last_record() if self._progress is not None else None
            seen, final = (None, False) if last_seen is None else last_seen
            self._resume_info = ResumeInfo(source, step, epoch, time.time() - created_unix, seen, final)

    def start_training(self, trainer: pl.Trainer) -> None:
        """Training starts (every rank): print the resume banner, and start a new generation when the directory
        holds checkpoints newer than the state this fit starts from."""
        self._progress_from = trainer.global_step
        if self._resume_info is not None:  # rank 0; checkpoint callbacks' hooks run last: costs are restored
            summaries = [cb.resume_summary() for cb in trainer_callbacks(trainer) if isinstance(cb, SummarisesResume)]
            rank_zero_info(self._resume_info.banner(summaries[0] if summaries else None))
            self._resume_info = None
        position = self._resumed_at or (self.generation, trainer.global_step)
        newer, top_generation = self._on_storage(lambda: newer_checkpoints(self.store, position), "Listing")
        if newer:
            self.generation = top_generation + 1
            shown = ", ".join(newer[:3]) + (f" and {len(newer) - 3} more" if len(newer) > 3 else "")
            rank_zero_warn(
                f"{self.store.dirpath} holds checkpoints newer than the state this fit starts from ({shown}). They "
                f"are kept, but this run's checkpoints (generation {self.generation}) supersede them on resume."
            )

    def record_progress(self, trainer: pl.Trainer, force: bool = False, final: bool = False) -> None:
        """Rank 0 records the step, once this fit has trained one (a failed start keeps the last attempt's record);
        ``final``: the attempt ends here."""
        started = self._progress_from is not None and trainer.global_step > self._progress_from
        if trainer.is_global_zero and self._progress is not None and started:
            self._progress.record(trainer.global_step, force=force, final=final)

    def manifest_fields(self, trainer: pl.Trainer, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
        """What a checkpoint's manifest records of the run and the model besides its files."""
        return {
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "run_id": str(self.run_id),
            "generation": self.generation,
            "world_size": trainer.world_size,
            "tensor_shapes": tensor_shapes(checkpoint["state_dict"]),  # the saved model's (a pipeline's gathered)
        }

    def newest_valid(self) -> str | None:
        """Path of the newest valid checkpoint with a manifest (``None``: none); every rank (rank 0 looks)."""
        choice = self._on_storage(lambda: choose_resume(self.store), "Looking for a checkpoint")
        return None if choice.manifest is None else choice.path

    def retain(self, remove: Callable[[str], None], keep: int, last: str | None) -> None:
        """On the writing rank: ``remove`` this run's checkpoints of this generation beyond the ``keep`` newest
        (``last`` not counted); a failure is warned about, and those files wait for the next save."""
        try:
            for name in expired(self.store, self.run_id, self.generation, keep, last):
                remove(name)
        except OSError as err:  # the new checkpoint is safe; an old one stays until the next save retries
            warnings.warn(
                f"Removing old checkpoints from {self.store.dirpath} failed ({err}); they are kept.", stacklevel=2
            )

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "generation": self.generation}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from a ``ResumableCheckpoint`` state (``global_step``: the step that checkpoint was saved at)."""
        self.run_id = state_dict.get("run_id", self.run_id)
        self.generation = state_dict.get("generation", 0)
        if state_dict.get("global_step") is not None:
            self._resumed_at = (self.generation, state_dict["global_step"])

    def _on_storage(self, fn: Callable[[], T], what: str) -> T:
        return on_storage(fn, what, self.store.dirpath)


def reported(choice: ResumeChoice) -> ResumeChoice:
    """``choice``, once its skipped checkpoints were warned about (and a stock file's use announced) on rank 0."""
    for line in choice.skipped:
        rank_zero_warn(f"Not resuming from {line}; looking for an older valid checkpoint.")
    if choice.path is not None and choice.manifest is None:
        rank_zero_info(
            f"Resuming from {choice.path}, which has no manifest (a stock ModelCheckpoint wrote it): it was checked "
            "as a complete training checkpoint instead. The checkpoints of this run carry manifests. Lightning may "
            "warn that the ModelCheckpoint callback is missing: its state (best and top-k paths) is not carried over."
        )
    return choice
