"""The one place where lightning-scale touches private parts of Lightning.

Lightning 2.6 offers no public hook for fifteen things lightning-scale needs; each is wrapped here, and
``tests/test_lightning_internals.py`` fails loudly when an upgrade moves them:

1. choosing the checkpoint to restore after the process group exists (auto-resume needs a collective decision,
   but ``Trainer.fit`` resolves ``ckpt_path`` before the strategy sets up);
2. running code right before the fit loop creates the training iterator (sampler epoch and per-rank loader state
   must be in place before ``iter()``, which already draws sampler indices);
3. the layout of Lightning's own loader state in a checkpoint (written by rank 0 only, then loaded into every rank);
4. the batch Lightning's data fetcher holds ahead for loaders without a length: a loader's ``state_dict()`` then
   describes the batch after the one the loop consumed, so the state per batch is kept and the consumed one used;
5. building the checkpoint dict without ``Trainer.save_checkpoint``'s barrier, so that a failed write on one rank is
   reported to all ranks instead of leaving them waiting at that barrier;
6. replacing Lightning's SIGTERM handler (it runs a collective inside the handler) — done by installing ours after
   Lightning's, in ``on_train_start`` — and then skipping the training loop's per-step broadcast of rank 0's SIGTERM
   flag, which only Lightning's handler sets (one collective every step, for a flag that can no longer change);
   stopping dataloader worker processes before an emergency exit (Lightning's ``CombinedLoader.reset`` only stops
   torch's own multi-process iterator, not torchdata's); and turning off the SLURM environment's ``auto_requeue``
   (Lightning's own USR1/SIGTERM handlers, which save ``hpc_ckpt_*`` files and requeue the job a second time), which
   the signal connector reads from the accelerator connector, not from the strategy (a single-device strategy has
   none);
7. whether the Trainer sends this training step's metrics to its loggers (``log_every_n_steps`` counts batches
   that stepped, a private counter), so metrics that cost something to compute are logged only then;
8. restoring weights, optimizers, schedulers and precision state from a checkpoint in the middle of fit (a rollback):
   the strategy's loaders are public, but the key of the precision plugin's state is Lightning's checkpoint layout;
9. continuing a W&B run after a restart: ``WandbLogger`` opens its run before any callback runs (in the setup
   hook, before the checkpoint with the run's id is loaded), and offers no public way to open another one;
10. changing every dataloader of a fit before its iterator starts worker processes (a validation loader's workers
    start inside the validation loop, with no callback hook between the loader's creation and ``iter()``): done in
    the strategy's ``process_dataloader``, which Lightning calls for each loader right after creating it;
11. the user's sampler inside the ``DistributedSamplerWrapper`` Lightning puts around it under DDP (to draw its
    shuffled order from the seed and the epoch, so that a resumed epoch repeats it);
12. the private members of Lightning's classes that our subclasses override or use (:data:`INHERITED_PRIVATE`): a
    subclass that keeps the parent's contract has to (``ModelCheckpoint`` saves through ``_save_checkpoint``, the
    strategies read the timeout and backend their parent resolved). Private members of other objects are reached
    only through this module and ``_torch_internals.py`` (tests/test_style.py checks);
13. the process-group timeout a strategy was given (``HangWatchdog`` keeps it longer than its own allowance);
14. an epoch resumed on another number of processes (``DataStateCheckpoint``): its batch count in the checkpoint's loop
    state, which counts batches of the old world size, and a reload of the training loaders after that epoch (the
    loader of the resumed epoch deals out its rest only; the loop measures the epochs after it anew);
15. the distributed sampler Lightning's DDP would put into a training loader, built for a world of one process
    (``DataStateCheckpoint``: a job that shrinks to one process, where Lightning picks a single-device strategy
    and injects none, keeps drawing the global order its epochs had on several), and whether the Trainer may inject
    one at all (``use_distributed_sampler``, kept by the accelerator connector only);
16. clipping gradients by norm for a sharded optimizer (``data_parallel``'s ZeRO): Lightning's precision plugin
    clips ``clip_grad_norm_`` over the optimizer's own parameters, which hold one rank's chunks, and offers no hook;
    the strategy routes the plugin's ``clip_grad_by_norm`` through its own norm over every rank, on the plugin
    instance it owns, and undoes it at teardown;
17. ``WandbLogger``'s arguments for ``wandb.init`` (``_wandb_init``): it always passes ``anonymous=None``, on which
    W&B prints "The anonymous setting has no effect" at every run; the command drops the unset value before the run
    opens.

Lightning objects whose methods lightning-scale replaces on one instance (each replacement undone, or scoped), and
what in Lightning makes the replacement take effect:

18. ``Trainer.save_checkpoint`` (``HangWatchdog``: a save is not a hang): ``ModelCheckpoint`` and users save through
    the Trainer instance's attribute;
19. ``LightningModule.configure_model`` (``model_parallel`` on a module without one): Lightning's
    ``ModelParallelStrategy.setup`` refuses a module that does not override it, although lightning-scale has
    parallelised the module already; a no-op stands in while that setup runs;
20. ``Strategy.load_checkpoint`` (``ResumableCheckpoint`` with sharded checkpoints, and single files on object
    stores): Lightning's checkpoint connector loads the checkpoint to resume from through the strategy instance's
    attribute, with a local path in mind; pipeline and ZeRO clipping (item 16) replace the precision plugin's
    ``clip_grad_by_norm``, which ``Precision.clip_gradients`` calls through the instance.
"""

from __future__ import annotations

import shutil
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.data import _auto_add_worker_init_fn, has_iterable_dataset, sized_len
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from lightning_scale import knobs

__all__ = [
    "CHECKPOINT_FIT_LOOP_KEYS",
    "INHERITED_PRIVATE",
    "before_train_iterator",
    "configure_model_stand_in",
    "consumed_batches_in_epoch",
    "consumed_loader_states",
    "ddp_sampler_on_one_process",
    "drop_lightning_loader_state",
    "drop_unset_wandb_anonymous",
    "dump_checkpoint",
    "is_last_batch_of_epoch",
    "load_checkpoints_with",
    "process_dataloaders_with",
    "process_group_timeout",
    "reopen_wandb_run",
    "restore_from_when_unset",
    "restore_training_state",
    "route_norm_clipping",
    "route_trainer_saves",
    "sampler_in_lightning_wrapper",
    "shut_down_dataloader_workers",
    "skip_sigterm_broadcast",
    "track_loader_states_when_fetching_ahead",
    "train_loaders",
    "trainer_logs_this_step",
    "writes_sharded_checkpoints",
]

INHERITED_PRIVATE: dict[str, tuple[str, ...]] = {
    "ModelCheckpoint": (
        "_find_last_checkpoints", "_get_metric_interpolated_filepath_name", "_last_checkpoint_saved",
        "_last_global_step_saved", "_monitor_candidates", "_remove_checkpoint", "_save_checkpoint",
        "_save_last_checkpoint", "_save_none_monitor_checkpoint", "_save_topk_checkpoint",
        "_should_skip_saving_checkpoint",
    ),
    "EarlyStopping": ("_generate_state_key",),
    "Callback": ("_generate_state_key",),
    "LightningCLI": ("_instantiate_trainer", "_parser"),
    "RichProgressBar": ("_get_train_description",),
    "DDPStrategy": ("_get_process_group_backend", "_timeout"),
    "ModelParallelStrategy": ("_data_parallel_size", "_get_process_group_backend", "_tensor_parallel_size", "_timeout"),
}  # fmt: skip
"""Per Lightning class: its private members that our subclasses of it override or use (see item 12)."""

CHECKPOINT_FIT_LOOP_KEYS = ("loops", "fit_loop", "state_dict")
_LOADER_CHAIN = "_lightning_scale_loader_chain"  # on the strategy instance: see process_dataloaders_with


def restore_from_when_unset(trainer: pl.Trainer, choose: Callable[[], str | None]) -> None:
    """Make this fit restore ``choose()`` when it was started without ``ckpt_path``.

    ``choose`` runs on every rank at the moment Lightning restores a checkpoint (after ``setup`` and
    ``configure_model``, so collectives and the model's parameters are available). An explicit ``ckpt_path``
    always wins and ``choose`` is not called; outside ``fit`` (validate, test, predict) nothing changes.
    """
    connector = trainer._checkpoint_connector
    connector.__dict__.pop("resume_start", None)  # a fit that failed before restoring left its wrapper behind
    original = connector.resume_start

    def resume_start(checkpoint_path: Any = None, weights_only: bool | None = None) -> None:
        connector.__dict__.pop("resume_start", None)  # one-shot: the class method is visible again
        if not checkpoint_path and trainer.state.fn == TrainerFn.FITTING:
            checkpoint_path = choose()
        original(checkpoint_path, weights_only)

    connector.resume_start = resume_start  # type: ignore[method-assign]  # on this instance, until it runs


def dump_checkpoint(trainer: pl.Trainer, weights_only: bool) -> dict[str, Any]:
    """The checkpoint dict ``Trainer.save_checkpoint`` would write; call on every rank (callbacks may gather)."""
    if trainer.model is None:
        raise RuntimeError("Saving a checkpoint is only possible if a model is attached to the Trainer.")
    return trainer._checkpoint_connector.dump_checkpoint(weights_only)


def before_train_iterator(trainer: pl.Trainer, fn: Callable[[list[Any]], None]) -> None:
    """Call ``fn(train_loaders)`` after Lightning loads loader states and before it creates the train iterator."""
    fit_loop = trainer.fit_loop
    original = type(fit_loop)._load_combined_loader_states

    def load_then_call() -> None:
        original(fit_loop)
        if fit_loop._combined_loader is not None:
            fn(list(fit_loop._combined_loader.flattened))

    fit_loop._load_combined_loader_states = load_then_call  # type: ignore[method-assign]  # on this instance


def shift_batches_in_epoch(checkpoint: dict[str, Any], delta: int) -> None:
    """Move the count of the current epoch's batches in a checkpoint's fit-loop state by ``delta`` (before the
    Trainer restores its loops from it)."""
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    for scope in ("current", "total"):
        for key, value in progress[scope].items():
            progress[scope][key] = value + delta


def reload_train_loaders_after(trainer: pl.Trainer, epoch: int) -> None:
    """Have the fit loop build its training loaders again (``train_dataloader()`` and every loader processing) at
    the start of the first epoch after ``epoch``, as ``reload_dataloaders_every_n_epochs`` would."""
    fit_loop = trainer.fit_loop
    original = type(fit_loop).setup_data

    def setup_data() -> None:
        if trainer.current_epoch > epoch:
            del fit_loop.setup_data  # once: the class method is visible again
            fit_loop._combined_loader = None
        original(fit_loop)

    fit_loop.setup_data = setup_data  # type: ignore[method-assign]  # on this instance, until it reloads


def train_loaders(trainer: pl.Trainer) -> list[Any]:
    """The training dataloaders of the running fit, flattened; empty before the fit loop set them up."""
    combined = trainer.fit_loop._combined_loader
    return [] if combined is None else list(combined.flattened)


def consumed_batches_in_epoch(trainer: pl.Trainer) -> int:
    """Batches the training loop has taken from the loader in the current epoch."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)


def is_last_batch_of_epoch(trainer: pl.Trainer) -> bool:
    """Whether the batch just consumed was the epoch's last one (so a resume starts the next epoch)."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def drop_lightning_loader_state(checkpoint: dict[str, Any]) -> None:
    """Remove Lightning's own loader state (rank 0's, which every rank would load) from a checkpoint dict."""
    node: Any = checkpoint
    for key in CHECKPOINT_FIT_LOOP_KEYS:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop("combined_loader", None)


def ddp_sampler_on_one_process(trainer: pl.Trainer, loader: Any) -> Any:
    """The sampler Lightning's DDP would put into training loader ``loader`` (a ``DistributedSampler``, or a
    ``DistributedSamplerWrapper`` around a sampler of the user's own) if the world were DDP's with one process: what
    it puts there on several, so that the order of an epoch is the same global one. ``None`` where DDP would inject
    none (``Trainer(use_distributed_sampler=False)``, a loader that is no ``DataLoader``, one that has a distributed
    sampler already, or one over an ``IterableDataset``)."""
    if (
        not isinstance(loader, DataLoader)
        or isinstance(loader.sampler, DistributedSampler)
        or has_iterable_dataset(loader)
        or not trainer._accelerator_connector.use_distributed_sampler
    ):
        return None
    # Lightning shuffles every training loader's distributed sampler (not with overfit_batches), shuffle=False too
    return _get_distributed_sampler(
        loader,
        shuffle=True,
        overfit_batches=trainer.overfit_batches,  # type: ignore[attr-defined]  # set in the Trainer's constructor
        mode=RunningStage.TRAINING,
        num_replicas=1,
        rank=0,
    )


def sampler_in_lightning_wrapper(sampler: Any) -> Any:
    """The user's sampler inside Lightning's ``DistributedSamplerWrapper`` (``None`` for any other sampler)."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    if not isinstance(sampler, DistributedSamplerWrapper):
        return None
    return sampler.dataset._sampler  # type: ignore[attr-defined]  # the wrapper's dataset is a _DatasetSamplerWrapper


class _StateTrackingCombinedLoader(CombinedLoader):
    """A ``CombinedLoader`` that remembers its loaders' states after each of the last few batches it returned."""

    state_history: deque[list[Any]]

    def __iter__(self) -> _StateTrackingCombinedLoader:
        self.state_history = deque(maxlen=knobs.LOADER_STATE_HISTORY)
        return super().__iter__()

    def __next__(self) -> Any:
        out = super().__next__()
        self.state_history.append([_state_or_none(loader) for loader in self.flattened])
        return out


def _state_or_none(loader: Any) -> Any:
    return loader.state_dict() if callable(getattr(loader, "state_dict", None)) else None


def track_loader_states_when_fetching_ahead(trainer: pl.Trainer) -> None:
    """Keep per-batch loader states for loaders without a length, the only ones Lightning fetches ahead for.

    Call right before the train iterator is created; loaders with a length cost nothing.
    """
    combined = trainer.fit_loop._combined_loader
    if type(combined) is CombinedLoader and any(sized_len(loader) is None for loader in combined.flattened):
        combined.__class__ = _StateTrackingCombinedLoader


def consumed_loader_states(trainer: pl.Trainer) -> list[Any]:
    """Each training loader's ``state_dict()`` (``None`` if it has none) as of the last batch the loop consumed."""
    combined = trainer.fit_loop._combined_loader
    if combined is None:
        return []
    ahead = len(getattr(trainer.fit_loop._data_fetcher, "batches", ()))
    if ahead == 0:
        return [_state_or_none(loader) for loader in combined.flattened]
    history = getattr(combined, "state_history", ())
    if len(history) <= ahead:
        raise RuntimeError(
            f"Lightning fetched {ahead} batch(es) ahead but only {len(history)} loader state(s) were recorded; "
            "the data position cannot be saved exactly. Please report this with your Lightning version."
        )
    return history[-1 - ahead]


def process_dataloaders_with(trainer: pl.Trainer, fn: Callable[[Any], Any], order: int = 0) -> Callable[[], None]:
    """Pass every dataloader Lightning prepares from now on (train, validation, test, predict, and reloads) through
    ``fn``, after Lightning's own preparation and before ``iter()``; ``fn`` returns the loader to use (the one it got,
    changed or not, or a new one). Several functions run in ascending ``order``. Returns the function that undoes
    this one."""
    strategy = trainer.strategy
    chain: list[tuple[int, Callable[[Any], Any]]] | None = vars(strategy).get(_LOADER_CHAIN)
    if chain is None:
        chain = vars(strategy)[_LOADER_CHAIN] = []
        original = strategy.process_dataloader

        def process_dataloader(dataloader: Any) -> Any:
            dataloader = original(dataloader)
            _auto_add_worker_init_fn(dataloader, trainer.global_rank)  # Lightning's next step: it skips a set function
            for _, step in sorted(chain, key=lambda entry: entry[0]):
                dataloader = step(dataloader)
            return dataloader

        strategy.process_dataloader = process_dataloader  # type: ignore[method-assign]
    entry = (order, fn)
    chain.append(entry)

    def undo() -> None:
        if entry in chain:
            chain.remove(entry)
        if not chain:
            vars(strategy).pop("process_dataloader", None)
            vars(strategy).pop(_LOADER_CHAIN, None)

    return undo


def skip_sigterm_broadcast(trainer: pl.Trainer) -> Callable[[], None]:
    """Stop the training loop's per-step broadcast of ``trainer.received_sigterm`` (rank 0's), while a handler other
    than Lightning's holds SIGTERM; returns the undo. Call on every rank alike: the broadcast is a collective."""
    loop = trainer.fit_loop.epoch_loop
    loop._broadcast_sigterm_tensor = _skip  # type: ignore[method-assign]  # an instance attribute hides the method
    return lambda: loop.__dict__.pop("_broadcast_sigterm_tensor", None)


def _skip() -> None:
    return None


def turn_off_slurm_auto_requeue(trainer: pl.Trainer) -> Callable[[], None]:
    """Keep Lightning from installing its SLURM auto-requeue signal handlers in this fit (call before the stage starts:
    the setup hook); returns the undo. Nothing to do outside a SLURM environment or where it is off already."""
    environment = trainer._accelerator_connector.cluster_environment
    if not (isinstance(environment, SLURMEnvironment) and environment.auto_requeue):
        return _skip
    environment.auto_requeue = False

    def undo() -> None:
        environment.auto_requeue = True

    return undo


def shut_down_dataloader_workers(trainer: pl.Trainer) -> None:
    """Stop the worker processes of every train and validation dataloader (torch's and torchdata's iterators)."""
    loops = [trainer.fit_loop, trainer.fit_loop.epoch_loop.val_loop]
    for combined in (getattr(loop, "_combined_loader", None) for loop in loops):
        if combined is None:
            continue
        mode_iterator = getattr(combined, "_iterator", None)  # holds iterators that loaders without persistent
        iterators = list(getattr(mode_iterator, "iterators", None) or [])  # workers never keep themselves
        iterators += [getattr(loader, "_iterator", None) for loader in combined.flattened]
        for iterator in iterators:
            if callable(getattr(iterator, "_shutdown_workers", None)):
                iterator._shutdown_workers()
        for loader in combined.flattened:
            if getattr(loader, "_iterator", None) is not None:
                loader._iterator = None


def drop_unset_wandb_anonymous(logger: WandbLogger) -> None:
    """Leave ``anonymous`` out of the arguments ``logger`` opens its run with, unless the user set it (item 17)."""
    if logger._wandb_init.get("anonymous") is None:
        logger._wandb_init.pop("anonymous", None)


def reopen_wandb_run(logger: WandbLogger, run_id: str) -> None:
    """Make ``logger`` continue the W&B run ``run_id`` (``resume="allow"``) instead of the run it opened at setup.

    Call on rank 0, before anything was logged to the run being replaced. That run is finished; offline, its local
    directory (empty but for W&B's own files) is removed, so only the continued run remains.
    """
    fresh = logger.experiment
    if fresh.id == run_id:
        return
    fresh_dir = Path(fresh.dir).parent if fresh.offline else None
    fresh.finish()
    if fresh_dir is not None:
        shutil.rmtree(fresh_dir, ignore_errors=True)
    logger._wandb_init.update(id=run_id, resume="allow")
    logger._id = run_id
    logger._experiment = None
    _ = logger.experiment  # opens the continued run now, as Lightning's setup did for the fresh one


def trainer_logs_this_step(trainer: pl.Trainer) -> bool:
    """In ``on_train_batch_end``: whether the Trainer sends the metrics logged at this step to its loggers."""
    return bool(trainer._logger_connector.should_update_logs)


def restore_training_state(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> None:
    """Load weights, optimizers, LR schedulers and the precision plugin's state; loops and data positions stay."""
    trainer.strategy.load_model_state_dict(checkpoint, strict=True)
    trainer.strategy.load_optimizer_state_dict(checkpoint)
    for config, state in zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", []), strict=True):
        config.scheduler.load_state_dict(state)
    precision_state = checkpoint.get(type(trainer.precision_plugin).__qualname__)  # as Lightning's dump names it
    if precision_state is not None:
        trainer.precision_plugin.load_state_dict(precision_state)
    for optimizer in trainer.optimizers:
        optimizer.zero_grad(set_to_none=True)


def writes_sharded_checkpoints(strategy: Any) -> bool:
    """Whether the strategy saves a checkpoint as a directory of per-rank shards (Lightning's ModelParallelStrategy
    with ``save_distributed_checkpoint=True``, FSDPStrategy with ``state_dict_type="sharded"``)."""
    return bool(getattr(strategy, "_save_distributed_checkpoint", False)) or (
        getattr(strategy, "_state_dict_type", None) == "sharded"
    )


def process_group_timeout(strategy: Any) -> timedelta:
    """The timeout a strategy gave its process group (Lightning's DDP, FSDP and model-parallel strategies, and
    ours); torch's default for others."""
    timeout = getattr(strategy, "_timeout", None)
    return timeout if isinstance(timeout, timedelta) else default_pg_timeout


def route_norm_clipping(plugin: Any, clip: Callable[[Any, float], bool]) -> Callable[[], None]:
    """Make the precision ``plugin`` clip by norm through ``clip(optimizer, max_norm)``, which returns ``False`` for
    an optimizer it leaves to the plugin; returns the undo."""
    original = plugin.clip_grad_by_norm

    def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
        if not clip(optimizer, clip_val):
            original(optimizer, clip_val)

    plugin.clip_grad_by_norm = clip_grad_by_norm
    return lambda: vars(plugin).pop("clip_grad_by_norm", None)


def route_trainer_saves(trainer: pl.Trainer, around: Callable[[], ContextManager[Any]]) -> Callable[[], None]:
    """Run every ``trainer.save_checkpoint(...)`` of this Trainer inside ``around()`` (item 18); returns the undo."""
    had_own = "save_checkpoint" in vars(trainer)
    original = trainer.save_checkpoint

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        with around():
            return original(*args, **kwargs)

    trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]

    def undo() -> None:
        if had_own:
            trainer.save_checkpoint = original  # type: ignore[method-assign]
        else:
            vars(trainer).pop("save_checkpoint", None)

    return undo


@contextmanager
def configure_model_stand_in(module: pl.LightningModule) -> Iterator[None]:
    """A no-op ``configure_model`` on ``module`` while the block runs (item 19)."""
    module.configure_model = lambda: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.configure_model


def load_checkpoints_with(
    strategy: Any, load: Callable[[Callable[..., dict[str, Any]], str, bool | None], Any]
) -> None:
    """Make ``strategy`` load checkpoints through ``load(lightning_load, path, weights_only)``, where
    ``lightning_load(path, weights_only)`` is the strategy class's own loader (item 20). Idempotent."""
    if getattr(strategy.load_checkpoint, "_lightning_scale_load", False):
        return
    lightning_load = type(strategy).load_checkpoint

    def load_checkpoint(checkpoint_path: str | Path, weights_only: bool | None = None) -> Any:
        return load(lambda path, only: lightning_load(strategy, path, only), str(checkpoint_path), weights_only)

    load_checkpoint._lightning_scale_load = True  # type: ignore[attr-defined]
    strategy.load_checkpoint = load_checkpoint
