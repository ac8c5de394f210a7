"""Every rank's data position and RNG state in the checkpoint, and each rank's own back on resume."""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch.utils.data import Sampler
from typing_extensions import override

from lightning_scale import distributed, knobs
from lightning_scale._lightning_internals import (
    before_train_iterator,
    consumed_batches_in_epoch,
    consumed_loader_states,
    drop_lightning_loader_state,
    is_last_batch_of_epoch,
    process_dataloaders_with,
    sampler_in_lightning_wrapper,
    track_loader_states_when_fetching_ahead,
    train_loaders,
)
from lightning_scale.callbacks._data_state_elastic import (
    ddp_sampler,
    draws_as_ddp,
    epoch_position_of,
    finish_epoch_elsewhere,
    keep_samples_per_step,
    rest_of_epoch_sampler,
)
from lightning_scale.callbacks._data_state_format import RankDataState, saved_ranks
from lightning_scale.callbacks._data_state_loaders import (
    loader_state,
    restore_generators,
    restore_loader,
    set_sampler_epoch,
)
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.checkpoint.rank_local import per_rank
from lightning_scale.data.elastic import EpochPosition, RestOfEpoch
from lightning_scale.data.resumable_loader import make_resumable, run_seed
from lightning_scale.data.worker_start import WorkerStartWatchdog
from lightning_scale.errors import ConfigurationError
from lightning_scale.rng import capture_rng_state, restore_rng_state

__all__ = ["DataStateCheckpoint"]

log = logging.getLogger(__name__)


class DataStateCheckpoint(Callback):
    """Save every rank's dataloader position and RNG states; give each rank its own back on resume.

    Stock Lightning stores one loader state, written by rank 0, which every rank loads; it saves no RNG state and
    does not restore the sampler's epoch before the resumed iterator draws indices. This callback, at every
    checkpoint, takes from each rank the ``state_dict()`` of its training ``StatefulDataLoader``\\ (s), the
    generators of its loaders and samplers, its epoch position and its RNG states (Python, NumPy, torch CPU and
    CUDA), and stores them as ``{"version": 1, "world_size": W, "ranks": [...]}``, one ``RankDataState`` each
    (``callbacks/_data_state_format.py``; gathered on rank 0 for a single-file
    checkpoint; in a sharded one each rank writes its own, see :mod:`lightning_scale.checkpoint.rank_local`;
    ``"rank_0"``, ``"rank_1"``, ... keys of earlier releases are read too). On resume each rank gets its
    own entry back, at the moments an uninterrupted run would have had it:

    - the sampler's epoch and the loader's position before the training iterator is created;
    - the RNG states after that iterator exists (mid-epoch), or before it (a checkpoint on an epoch's last batch,
      which resumes into the next epoch instead of running an empty one).

    A checkpoint written by a different number of processes resumes too (an elastic job that lost or gained nodes):
    at an epoch's end the next epoch is split for the new world size; in the middle of an epoch every sample the
    epoch has left is seen exactly once, dealt to the new processes one global batch at a time
    (:mod:`lightning_scale.data.elastic`), and the epochs after it are those of a run on the new world size. That
    needs one training ``DataLoader`` with a batch size, drawn through Lightning's distributed sampler (as it is
    under DDP), made resumable here, and no ``limit_train_batches``; otherwise the resume is refused before the first
    step, naming why (a loader whose order differs from the checkpoint's: what differs, with both values, and the
    fix). The RNG states of the old ranks are not restored on another world size. With ``keep_global_batch=True``
    the samples per optimizer step stay those of the run that wrote the checkpoint: ``Trainer.accumulate_grad_batches``
    is set so (4 processes x 8 samples -> 2 processes x 8 samples x 2 batches per step), and a world size that cannot
    keep it is refused. On one process without a parallel strategy (what Lightning picks for ``strategy="auto"``),
    where Lightning puts no distributed sampler into the loader, the training loader draws through the one DDP would
    give it on one process when the fit runs under torchrun or resumes a checkpoint drawn through one: an elastic job
    that shrinks to one process keeps the global order of its epochs, and can grow again in the middle of one.

    The training loaders are made resumable as users write them (``make_loaders_resumable``, see
    :func:`~lightning_scale.data.resumable_loader.make_resumable`): torch's ``DataLoader`` becomes a
    ``StatefulDataLoader`` with the same arguments; ``shuffle=True``, a ``RandomSampler`` (also inside Lightning's
    ``DistributedSamplerWrapper``) draw each epoch's order from (seed, epoch), the seed being the loader's
    ``generator``'s, ``seed_everything``'s, or else one drawn at the run's start and checkpointed; workers' RNG
    states are checkpointed; in a distributed run, workers start from a forkserver when no
    ``multiprocessing_context`` was chosen and that changes nothing they do. What still cannot resume exactly (an
    ``IterableDataset`` or a sampler without state, an iterable that is no ``DataLoader``) is named in a warning at
    the start of every fit; with ``strict=True`` it is refused before the first step. Training loaders whose workers
    deliver no batch within ``worker_start_timeout_s`` of an epoch's start, and validation loaders whose workers
    deliver none within it of a validation run's start (the sanity check's included), are reported with every stack
    of the process and its workers, and the process exits with ``STUCK_WORKERS_EXIT_CODE`` (124) so that the job is
    restarted.

    ``ResumableCheckpoint`` adds this callback when the Trainer has none; it also works beside Lightning's plain
    ``ModelCheckpoint``.

    Args:
        make_loaders_resumable: Rebuild and reseed training loaders as described above; ``False`` leaves them as
            given (for pipelines that manage their own state).
        strict: Refuse to train, before the first step, when a training loader cannot resume exactly.
        worker_start_timeout_s: Seconds a training loader's workers may take to deliver their first batch of an
            epoch, and a validation loader's the first batch of a validation run
            (``LIGHTNING_SCALE_WORKER_START_TIMEOUT_S`` sets the default).
        keep_global_batch: On a resume, set ``Trainer.accumulate_grad_batches`` so that an optimizer step takes as
            many samples as in the run that wrote the checkpoint, whatever the number of processes now.

    Examples:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[DataStateCheckpoint()], logger=False, enable_progress_bar=False)
    """

    def __init__(
        self,
        make_loaders_resumable: bool = True,
        strict: bool = False,
        worker_start_timeout_s: float = knobs.WORKER_START_TIMEOUT_S,
        keep_global_batch: bool = False,
    ) -> None:
        if worker_start_timeout_s <= 0:
            raise ConfigurationError(
                f"worker_start_timeout_s={worker_start_timeout_s} must be > 0 (seconds for a loader's workers to "
                "deliver their first batch)."
            )
        self.make_loaders_resumable = make_loaders_resumable
        self.strict = strict
        self.worker_start_timeout_s = worker_start_timeout_s
        self.keep_global_batch = keep_global_batch
        self._trainer: pl.Trainer | None = None
        self._pending: RankDataState | None = None  # this rank's saved state, until training starts
        self._problems: list[str] = []
        self._undo_loaders: Callable[[], None] | None = None
        self._watchdog: WorkerStartWatchdog | None = None
        self._drawn_seed: int | None = None  # the run's seed for loaders the user gave none; checkpointed
        self._loaded_checkpoint: dict[str, Any] | None = None  # between on_load_checkpoint and load_state_dict
        self._rest_start: EpochPosition | None = None  # an epoch to finish on this world size, until its loader exists
        self._rest: RestOfEpoch | None = None  # this rank's share of that epoch, while it runs
        # whether the checkpoint being resumed drew its training data through a distributed sampler (None: no
        # checkpoint, or one that does not say): a process without one then draws as DDP would
        self._saved_distributed: bool | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._trainer = trainer
            self._problems = []
            self._drawn_seed = None  # a resume's checkpoint brings its own back before the loaders are built
            self._saved_distributed = None
            before_train_iterator(trainer, self._before_train_iterator)
            self._undo_loaders = process_dataloaders_with(trainer, self._process_loader)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = None
        self._pending = None
        self._loaded_checkpoint = None
        self._rest_start = self._rest = None
        if self._undo_loaders is not None:
            self._undo_loaders()
            self._undo_loaders = None
        self._stop_watchdog()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop_watchdog()  # Lightning skips teardown after an error; an armed watchdog would end the process later

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None

    def state_dict(self) -> dict[str, Any]:
        if self._trainer is None:
            return {}
        # gathered for rank 0's file; kept by each rank's shard
        ranks = per_rank(self._local_state(self._trainer).to_dict())
        return {"version": STATE_VERSION, "world_size": distributed.world_size(), "ranks": ranks}

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self._trainer is not None:
            drop_lightning_loader_state(checkpoint)

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._loaded_checkpoint = checkpoint  # an elastic resume moves its batch count (load_state_dict, next)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        checkpoint, self._loaded_checkpoint = self._loaded_checkpoint, None
        if self._trainer is None:
            return  # validate/test/predict restore callbacks too; data positions matter only to fit
        check_state_version(state_dict, "DataStateCheckpoint", missing=None)
        saved_world, ranks = saved_ranks(state_dict)
        world = distributed.world_size()
        # every rank records the epoch's global position: on the same world size each reads its own entry only (a
        # sharded checkpoint's rank file, a memory snapshot held on another node), else rank 0's
        saved = RankDataState.from_dict(ranks[distributed.rank() if saved_world == world else 0])
        self._saved_distributed = None if not saved.positions else any(p is not None for p in saved.positions)
        self._drawn_seed = saved.drawn_seed
        if saved_world == world:
            self._pending = saved
            if saved.rest_start is not None and not saved.end_of_epoch:  # saved while finishing an elastic epoch
                self._rest_start = saved.rest_start
        else:
            self._pending = RankDataState(saved.epoch, saved.end_of_epoch)  # no loader or RNG state of another world
            if saved.end_of_epoch:
                rank_zero_warn(
                    f"Resuming a checkpoint written by {saved_world} processes with {world}: the next epoch is split "
                    f"for {world} processes and the RNG streams are not restored, so this run will not match one that "
                    f"kept {saved_world} processes."
                )
            else:
                self._rest_start = finish_epoch_elsewhere(
                    self._trainer, saved, saved_world, world, checkpoint, self.make_loaders_resumable
                )
        if self.keep_global_batch and self._trainer is not None:
            keep_samples_per_step(self._trainer, saved)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pending, self._pending = self._pending, None
        if pending is None or pending.end_of_epoch:
            return
        for loader, saved in zip(train_loaders(trainer), pending.loaders or [], strict=bool(pending.loaders)):
            restore_generators(loader, saved.generators)
        if pending.rng is not None:  # None: another world size's
            restore_rng_state(pending.rng)

    def _local_state(self, trainer: pl.Trainer) -> RankDataState:
        loaders = train_loaders(trainer)
        return RankDataState(
            epoch=trainer.current_epoch,
            end_of_epoch=is_last_batch_of_epoch(trainer),
            batches_consumed=consumed_batches_in_epoch(trainer),
            loaders=[
                loader_state(loader, state)
                for loader, state in zip(loaders, consumed_loader_states(trainer), strict=True)
            ],
            rng=capture_rng_state(),
            drawn_seed=self._drawn_seed,
            positions=[epoch_position_of(trainer, loader) for loader in loaders],
            rest_start=None if self._rest is None else self._rest.start,
        )

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rest is not None and trainer.current_epoch > self._rest.start.epoch:
            self._rest = None  # the loaders were built anew for this epoch
        what = f"rank {trainer.global_rank}, training dataloader(s) of epoch {trainer.current_epoch}"
        self._watch_worker_start(train_loaders(trainer), what)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._watchdog is not None:
            self._watchdog.disarm()

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._trainer is None or trainer.val_dataloaders is None:
            return  # a fit's validation runs only: its loaders' workers were forked able to report their stacks
        when = (
            "the sanity check"
            if trainer.sanity_checking
            else f"epoch {trainer.current_epoch}, step {trainer.global_step}"
        )
        what = f"rank {trainer.global_rank}, validation dataloader(s) of {when}"
        self._watch_worker_start(CombinedLoader(trainer.val_dataloaders).flattened, what)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._watchdog is not None:
            self._watchdog.disarm()

    def _process_loader(self, loader: Any) -> Any:
        trainer = self._trainer
        if trainer is not None and not trainer.training and getattr(loader, "num_workers", 0) > 0:
            # validation workers are forked in the loop, before any hook that could arm the watchdog
            WorkerStartWatchdog.let_workers_report_stacks()
        if trainer is None or not trainer.training or not self.make_loaders_resumable:
            return loader  # only training loaders have a position to resume
        name = f"training dataloader #{len(self._problems)} ({type(loader).__name__})"
        start, self._rest_start = self._rest_start, None
        as_ddp = draws_as_ddp(trainer, self._saved_distributed)
        result = make_resumable(
            loader,
            seed=self._seed(loader),
            world_size=trainer.world_size,
            rank=trainer.global_rank,
            name=name,
            inner_sampler=sampler_in_lightning_wrapper,
            wrap_sampler=None if start is None else functools.partial(self._rest_of_epoch, trainer, start, name),
            replace_sampler=None if as_ddp is None else functools.partial(ddp_sampler, trainer, name, as_ddp),
        )
        if start is not None and (self._rest is None or result.loader.batch_size != start.batch_size):
            raise ConfigurationError(
                f"Epoch {start.epoch} resumes on {trainer.world_size} processes, but {name} cannot deal out its rest: "
                f"it is no DataLoader with batch_size={start.batch_size} over a distributed sampler, as the loader "
                "that wrote the checkpoint was. Return the same train_dataloader(), or resume on the old world size."
            )
        self._problems.append("\n".join(result.problems))
        return result.loader

    def _rest_of_epoch(self, trainer: pl.Trainer, start: EpochPosition, name: str, sampler: Any) -> Sampler[int]:
        """``sampler`` dealing out the rest of ``start``'s epoch first; this rank's share of it is kept."""
        wrapped, self._rest = rest_of_epoch_sampler(trainer, start, name, sampler)
        return wrapped

    def _seed(self, loader: Any) -> int:
        """The user's seed for ``loader``; without one, a seed drawn once per run (by rank 0, for every rank) and kept
        in the checkpoint, so that unseeded runs still differ from each other and a resumed one keeps its orders."""
        given = run_seed(loader, _seed_everything_seed())
        if given is not None:
            return given
        if self._drawn_seed is None:
            self._drawn_seed = distributed.broadcast_object(secrets.randbits(63))  # not from the RNG users draw from
        return self._drawn_seed

    def _before_train_iterator(self, loaders: list[Any]) -> None:
        problems = [problem for problem in self._problems if problem]
        self._problems = []
        if problems and self.strict:
            raise ConfigurationError(
                "The training data cannot resume exactly (DataStateCheckpoint(strict=True), "
                "ResumableCheckpoint(strict_resume=True)):\n- " + "\n- ".join(problems)
            )
        for problem in problems:
            rank_zero_warn(problem)
        if self._trainer is not None:
            track_loader_states_when_fetching_ahead(self._trainer)
        pending = self._pending
        if pending is None:
            return
        saved = pending.loaders
        if saved is not None and len(saved) != len(loaders):
            raise ConfigurationError(
                f"The checkpoint holds data state for {len(saved)} training dataloader(s), this run has "
                f"{len(loaders)}. Resume with the same train_dataloader() structure that wrote the checkpoint."
            )
        end_of_epoch = pending.end_of_epoch
        epoch = pending.epoch + int(end_of_epoch)
        for index, loader in enumerate(loaders):
            set_sampler_epoch(loader, epoch)
            if saved is not None:
                restore_loader(loader, saved[index], end_of_epoch)
        if end_of_epoch and pending.rng is not None:
            restore_rng_state(pending.rng)

    def _watch_worker_start(self, loaders: list[Any], what: str) -> None:
        """From the start of a training epoch or a validation run to its first batch (which a restored position's
        fast-forward precedes); the first batch of a loader without a length is fetched ahead before this (for
        training, in the first epoch of a fit only), unwatched."""
        if not any(getattr(loader, "num_workers", 0) > 0 for loader in loaders):
            return
        if self._watchdog is None:
            self._watchdog = WorkerStartWatchdog(self.worker_start_timeout_s)
        self._watchdog.arm(what)


def _seed_everything_seed() -> int | None:
    seed = os.environ.get("PL_GLOBAL_SEED")  # set by lightning's seed_everything
    return None if seed is None else int(seed)
