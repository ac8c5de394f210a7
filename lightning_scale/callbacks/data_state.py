"""Every rank's data position and RNG state in the checkpoint, and each rank's own back on resume."""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
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
    keep_samples_per_step,
    rest_of_epoch_sampler,
    resume_on_another_world,
)
from lightning_scale.callbacks._data_state_format import RankDataState, saved_ranks
from lightning_scale.callbacks._data_state_loaders import (
    loader_state,
    restore_generators,
    restore_loader,
    set_sampler_epoch,
)
from lightning_scale.callbacks._data_state_validation import TrainingRng
from lightning_scale.callbacks._data_state_worker_watch import WorkerStartWatch
from lightning_scale.callbacks._state import STATE_VERSION, check_state_version
from lightning_scale.checkpoint.rank_local import per_rank
from lightning_scale.data.elastic import EpochPosition, RestOfEpoch
from lightning_scale.data.forkserver import start_workers_safely
from lightning_scale.data.resumable_loader import make_resumable, run_seed
from lightning_scale.errors import ConfigurationError
from lightning_scale.rng import restore_rng_state

__all__ = ["DataStateCheckpoint"]


class DataStateCheckpoint(Callback):
    """Save every rank's dataloader position and RNG states; give each rank its own back on resume.

    Stock Lightning stores one loader state, written by rank 0, which every rank loads, and no RNG state. This
    callback stores each rank's ``RankDataState`` (its training loaders' ``state_dict()`` and generators, its epoch
    position, its RNG states; ``callbacks/_data_state_format.py``) and gives it back on resume when an uninterrupted
    run would have had it: the sampler's epoch and the loader's position before the training iterator is created,
    the RNG states after it (mid-epoch) or before it (at an epoch's end). On another number of processes the rest of
    the epoch is dealt once to the new ranks (``callbacks/_data_state_elastic.py``), or the resume is refused before
    the first step, naming why. Training loaders are made resumable as users write them
    (:func:`~lightning_scale.data.make_resumable`); what cannot resume exactly is named in a warning at every fit's
    start, or refused with ``strict=True``; evaluation loaders' workers start from a forkserver, as training loaders'
    do (:func:`~lightning_scale.data.forkserver.start_workers_safely`). Loaders whose workers deliver no first batch
    within ``worker_start_timeout_s`` are reported with every stack, and the process exits with 124 so that the job is
    restarted. ``ResumableCheckpoint`` adds this callback when the Trainer has none; it works beside Lightning's
    ``ModelCheckpoint`` too. The documentation's DataStateCheckpoint page details each.

    Args:
        make_loaders_resumable: Rebuild and reseed training loaders as described above (and give evaluation loaders a
            forkserver); ``False`` leaves every loader as given (for pipelines that manage their own state).
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
        self._workers = WorkerStartWatch(worker_start_timeout_s)  # checks the timeout
        self.make_loaders_resumable = make_loaders_resumable
        self.strict = strict
        self.worker_start_timeout_s = worker_start_timeout_s
        self.keep_global_batch = keep_global_batch
        self._trainer: pl.Trainer | None = None
        self._pending: RankDataState | None = None  # this rank's saved state, until training starts
        self._problems: list[str] = []
        self._undo_loaders: Callable[[], None] | None = None
        self._drawn_seed: int | None = None  # the run's seed for loaders the user gave none; checkpointed
        self._loaded_checkpoint: dict[str, Any] | None = None  # between on_load_checkpoint and load_state_dict
        self._rest_start: EpochPosition | None = None  # an epoch to finish on this world size, until its loader exists
        self._rest: RestOfEpoch | None = None  # this rank's share of that epoch, while it runs
        # whether the checkpoint being resumed drew its training data through a distributed sampler (None: no
        # checkpoint, or one that does not say): a process without one then draws as DDP would
        self._saved_distributed: bool | None = None
        self._rng = TrainingRng()  # validation leaves it as it found it

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._trainer = trainer
            self._problems = []
            self._drawn_seed = None  # a resume's checkpoint brings its own back before the loaders are built
            self._saved_distributed = None
            self._workers = WorkerStartWatch(self.worker_start_timeout_s)  # the attribute as it is when the fit starts
            before_train_iterator(trainer, self._before_train_iterator)
            self._undo_loaders = process_dataloaders_with(trainer, self._process_loader)
            self._rng.attach(trainer)
        elif self.make_loaders_resumable:  # validate, test, predict: their loaders' workers start safely too
            self._undo_loaders = process_dataloaders_with(trainer, functools.partial(_evaluation_loader, trainer))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = self._pending = self._loaded_checkpoint = None
        self._rest_start = self._rest = None
        if self._undo_loaders is not None:
            self._undo_loaders()
            self._undo_loaders = None
        self._rng.detach()
        self._workers.close()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._workers.close()  # Lightning skips teardown after an error; an armed watchdog would end the process later
        self._rng.detach()

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
            self._rest_start = resume_on_another_world(
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
            rng=self._rng.state(),
            drawn_seed=self._drawn_seed,
            positions=[epoch_position_of(trainer, loader) for loader in loaders],
            rest_start=None if self._rest is None else self._rest.start,
        )

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rest is not None and trainer.current_epoch > self._rest.start.epoch:
            self._rest = None  # the loaders were built anew for this epoch
        self._workers.training_epoch_starts(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._workers.first_batch()

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._trainer is not None:  # a fit's validation runs only: its loaders' workers can report their stacks
            self._workers.validation_starts(trainer)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._workers.first_batch()

    def _process_loader(self, loader: Any) -> Any:
        trainer = self._trainer
        if trainer is not None:
            WorkerStartWatch.loader_prepared(trainer, loader)
        if trainer is None or not self.make_loaders_resumable:
            return loader
        if not trainer.training:  # only training loaders have a position to resume
            return _evaluation_loader(trainer, loader)
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


def _seed_everything_seed() -> int | None:
    seed = os.environ.get("PL_GLOBAL_SEED")  # set by lightning's seed_everything
    return None if seed is None else int(seed)


def _evaluation_loader(trainer: pl.Trainer, loader: Any) -> Any:
    """A validation, test or prediction ``loader``, its workers started from a forkserver in a distributed run (their
    fork can deadlock as a training loader's can; see :mod:`lightning_scale.data.forkserver`)."""
    stage = trainer.state.stage
    prefix = stage.dataloader_prefix if stage is not None else "evaluation"
    start_workers_safely(loader, f"{prefix}_dataloader ({type(loader).__name__})", trainer.world_size)
    return loader
