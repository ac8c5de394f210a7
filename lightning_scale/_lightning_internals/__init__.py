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
   that stepped, a private counter), so metrics that cost something to compute are logged only then, and the step
   those metrics are sent with, at which the callbacks send theirs to the loggers directly (``self.log`` costs
   ~0.3 ms a metric: :func:`~lightning_scale._lightning_internals.loggers.log_step_metrics`);
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
    ``clip_grad_by_norm``, which ``Precision.clip_gradients`` calls through the instance;
21. ``_EvaluationLoop.run``, ``increment_progress_to_evaluation_end`` and ``setup_data`` of the fit loop's
    validation (``DataStateCheckpoint``: validation leaves the training's random generators as it found them): the
    training epoch loop runs each validation, and on resume skips the one after the checkpoint's step, and the fit
    loop sets the loaders up at its start, through its ``val_loop`` instance's attributes; the first two build the
    loaders' iterators inside, ``setup_data`` calls ``val_dataloader()``.
"""

from __future__ import annotations

from lightning_scale._lightning_internals.checkpoints import (
    dump_checkpoint,
    load_checkpoints_with,
    restore_from_when_unset,
    restore_training_state,
    writes_sharded_checkpoints,
)
from lightning_scale._lightning_internals.loaders import (
    ddp_sampler_on_one_process,
    process_dataloaders_with,
    sampler_in_lightning_wrapper,
    shut_down_dataloader_workers,
)
from lightning_scale._lightning_internals.loggers import (
    drop_unset_wandb_anonymous,
    log_step_metrics,
    reopen_wandb_run,
    trainer_logs_this_step,
)
from lightning_scale._lightning_internals.loops import (
    CHECKPOINT_FIT_LOOP_KEYS,
    before_train_iterator,
    consumed_batches_in_epoch,
    consumed_loader_states,
    drop_lightning_loader_state,
    during_fit_validation,
    is_last_batch_of_epoch,
    reload_train_loaders_after,
    shift_batches_in_epoch,
    track_loader_states_when_fetching_ahead,
    train_loaders,
)
from lightning_scale._lightning_internals.patches import (
    configure_model_stand_in,
    process_group_timeout,
    route_norm_clipping,
    route_trainer_saves,
)
from lightning_scale._lightning_internals.signals import skip_sigterm_broadcast, turn_off_slurm_auto_requeue

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
    "during_fit_validation",
    "is_last_batch_of_epoch",
    "load_checkpoints_with",
    "log_step_metrics",
    "process_dataloaders_with",
    "process_group_timeout",
    "reload_train_loaders_after",
    "reopen_wandb_run",
    "restore_from_when_unset",
    "restore_training_state",
    "route_norm_clipping",
    "route_trainer_saves",
    "sampler_in_lightning_wrapper",
    "shift_batches_in_epoch",
    "shut_down_dataloader_workers",
    "skip_sigterm_broadcast",
    "track_loader_states_when_fetching_ahead",
    "train_loaders",
    "trainer_logs_this_step",
    "turn_off_slurm_auto_requeue",
    "writes_sharded_checkpoints",
]

INHERITED_PRIVATE: dict[str, tuple[str, ...]] = {
    "ModelCheckpoint": (
        "_every_n_epochs", "_every_n_train_steps", "_find_last_checkpoints", "_generate_state_key",
        "_get_metric_interpolated_filepath_name", "_last_checkpoint_saved", "_last_global_step_saved",
        "_monitor_candidates", "_remove_checkpoint", "_save_checkpoint", "_save_last_checkpoint",
        "_save_none_monitor_checkpoint", "_save_topk_checkpoint", "_should_skip_saving_checkpoint",
        "_train_time_interval",
    ),
    "EarlyStopping": ("_generate_state_key",),
    "Callback": ("_generate_state_key",),
    "LightningCLI": ("_instantiate_trainer", "_parse_ckpt_path"),
    "RichProgressBar": ("_get_train_description",),
    "DDPStrategy": ("_get_process_group_backend", "_timeout"),
    "ModelParallelStrategy": ("_data_parallel_size", "_get_process_group_backend", "_tensor_parallel_size", "_timeout"),
}  # fmt: skip
"""Per Lightning class: its private members that our subclasses of it override or use (see item 12)."""
