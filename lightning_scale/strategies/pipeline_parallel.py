"""``pipeline_parallel``: torch.distributed.pipelining schedules behind Lightning's Trainer."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import is_last_batch_of_epoch, route_norm_clipping, trainer_logs_this_step
from lightning_scale._trainer_attributes import trainer_callbacks, trainer_fast_dev_run
from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.pipeline.batch import inputs_and_target, inputs_of, loss_fn_of
from lightning_scale.parallel.pipeline.clipping import clip_grad_norm_across_
from lightning_scale.parallel.pipeline.ddp_arguments import refuse_wrapper_arguments
from lightning_scale.parallel.pipeline.gradients import GradientStash
from lightning_scale.parallel.pipeline.grid import PipelineGrid
from lightning_scale.parallel.pipeline.layout import checked_stack
from lightning_scale.parallel.pipeline.runner import PipelineRunner
from lightning_scale.parallel.pipeline.schedules import ScheduleName, schedule_spec
from lightning_scale.parallel.pipeline.split import plan_stages, split_module_
from lightning_scale.parallel.pipeline.state import (
    gather_model_state,
    gather_optimizer_state,
    stage_model_state,
    stage_optimizer_states,
)

__all__ = ["PipelineParallelStrategy"]

TrainLossLogging = Literal["when_read", "every_step"]
TRAIN_LOSS = "train_loss"


class PipelineParallelStrategy(DDPStrategy):
    """Pipeline parallelism with torch's own schedules, registered as ``pipeline_parallel``.

    The LightningModule keeps its whole network, in order, in one ``nn.Sequential`` or ``nn.ModuleList`` (the
    attribute named by ``module``, default ``model``) and adds two methods:

    - ``pipeline_loss_fn(output, target) -> Tensor``: the loss of one microbatch, computed on the last stage;
    - ``pipeline_split_batch(batch) -> (inputs, target)`` (optional; default: a batch ``(inputs, target)``).

    Every trainable parameter must be inside the stack (refused before training otherwise). The stack is split into
    ``pipeline_size x stages_per_rank`` stages balanced by parameter count, each rank keeping its blocks under their
    original names; the schedule runs in place of the module's train/validation/test/predict steps and logs
    ``train_loss``, ``val_loss`` and ``test_loss`` (the last stage's mean microbatch loss, on every rank). The training
    step returns that loss on every rank and every step (the ``outputs`` of ``on_train_batch_end``); ``train_loss`` is
    logged, by default, only on the steps where something reads it (``log_train_loss``). With
    ``world_size = pipeline_size x dp``, ``dp`` replicas read their own data shard and average gradients. Clipping by
    norm spans all stages; checkpoints hold the unsplit model's weights, the optimizer states per pipeline rank. A
    model built under ``Trainer.init_module(empty_init=True)`` is allocated per stage after the split. The README's
    "Pipeline parallelism" section has the details.

    Args:
        schedule: ``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``looped_bfs``, ``interleaved_zero_bubble`` or
            ``zbv_zero_bubble``.
        n_microbatches: Microbatches per batch; must divide the batch size.
        stages_per_rank: Stages (virtual stages) per rank: 1 for ``gpipe``/``1f1b``, default 2 for the others.
        pipeline_size: Ranks per pipeline (default: all); must divide the world size.
        module: Attribute of the LightningModule holding the stack of blocks.
        process_group_backend: ``gloo`` or ``nccl`` (default: by device).
        timeout: Timeout of collectives and point-to-point transfers.
        log_train_loss: ``when_read``: log ``train_loss`` on the steps where something reads it: a step the loggers
            write (``log_every_n_steps``, ``fast_dev_run``, a stop), a refresh of the progress bar (every step for a bar
            other than Lightning's TQDM one), the last batch of an epoch or of ``max_steps``, and every step while a
            callback or LR scheduler monitors ``train_loss`` or a checkpoint's ``filename`` names it. On other steps
            ``trainer.callback_metrics["train_loss"]`` holds the loss of the latest step that logged it.
            ``every_step``: log it on every step (``self.log`` is a large share of a small step's time).

    Examples:
        >>> import lightning_scale  # registers the strategy
        >>> strategy = PipelineParallelStrategy(schedule="1f1b", n_microbatches=8)
    """

    strategy_name = "pipeline_parallel"

    def __init__(
        self,
        schedule: ScheduleName = "1f1b",
        n_microbatches: int = 4,
        stages_per_rank: int | None = None,
        pipeline_size: int | None = None,
        module: str = "model",
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        log_train_loss: TrainLossLogging = "when_read",
        **kwargs: Any,
    ) -> None:
        spec = schedule_spec(schedule)
        if log_train_loss not in ("when_read", "every_step"):
            raise ConfigurationError(
                f"log_train_loss={log_train_loss!r} is not 'when_read' or 'every_step' "
                "(--trainer.strategy.log_train_loss)."
            )
        if n_microbatches < 1:
            raise ConfigurationError(
                f"n_microbatches={n_microbatches} must be >= 1 (--trainer.strategy.n_microbatches)."
            )
        stages_per_rank = spec.stages_per_rank(stages_per_rank)
        if pipeline_size is not None and pipeline_size < 1:
            raise ConfigurationError(f"pipeline_size={pipeline_size} must be >= 1 (--trainer.strategy.pipeline_size).")
        if timeout is not None:
            kwargs["timeout"] = timeout
        refuse_wrapper_arguments(kwargs)
        super().__init__(process_group_backend=process_group_backend, **kwargs)
        self.schedule = schedule
        self.n_microbatches = n_microbatches
        self.stages_per_rank = stages_per_rank
        self.pipeline_size = pipeline_size
        self.module = module
        self.log_train_loss = log_train_loss
        self._spec = spec
        self._mesh: Any = None
        self._runner: PipelineRunner | None = None
        self._unroute_clipping: Callable[[], None] = lambda: None
        self._stash = GradientStash()

    # ----------------------------------------------------------------------------------------------- layout

    @property
    def _grid(self) -> PipelineGrid:
        return PipelineGrid(self.world_size, self.global_rank, self.pipeline_size or self.world_size)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # every stage of one pipeline must see the same batches; pipeline replicas read different shards
        return {"num_replicas": self._grid.replicas, "rank": self._grid.replica}

    @property
    def _module(self) -> pl.LightningModule:
        module = self.lightning_module
        assert module is not None, "the strategy runs steps only once the Trainer has connected the module"
        return module

    @property
    def _pipeline(self) -> PipelineRunner:
        assert self._runner is not None, "setup() splits the model before any step"
        return self._runner

    @override
    def setup_distributed(self) -> None:
        self.set_world_ranks()
        distributed.init_process_group_per_attempt(
            self._get_process_group_backend(), self.global_rank, self.world_size, self._timeout
        )
        super().setup_distributed()
        grid = self._grid  # refuses a pipeline_size that does not divide the world size
        self._mesh = distributed.device_mesh(self.root_device.type, (grid.replicas, grid.pipeline_size), ("dp", "pp"))

    # ------------------------------------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        if self._runner is None:
            self._split(trainer.lightning_module)  # before the optimizers see the parameters
        self.precision_plugin.convert_module(self._module)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        # Lightning clips through the precision plugin with each rank's own norm; the norm must span all stages
        self._unroute_clipping = route_norm_clipping(self.precision_plugin, self._clip_grad_by_norm)

    @override
    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        # empty_init: build on the meta device; each rank allocates only its own blocks after the split
        with torch.device("meta") if empty_init else nullcontext(), self.precision_plugin.tensor_init_context():
            yield

    def _clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> bool:
        group = self._mesh.get_group("pp")
        parameters = self.precision_plugin.main_params(optimizer)
        clip_grad_norm_across_(parameters, clip_val, lambda t: distributed.all_reduce_sum_(t, group=group))
        return True

    def _split(self, pl_module: pl.LightningModule) -> None:
        stack, frozen_outside = checked_stack(pl_module, self.module)
        if frozen_outside:
            rank_zero_warn(
                f"pipeline_parallel: frozen parameters outside {self.module!r} ({', '.join(frozen_outside[:6])}) are "
                "not part of the pipeline's forward, which runs the stack only; put their modules into the stack if "
                "forward() uses them."
            )
        loss_fn = loss_fn_of(pl_module)
        grid, group = self._grid, self._mesh.get_group("pp")
        plan = plan_stages(stack, grid.pipeline_size * self.stages_per_rank, grid.pipeline_size, self._spec.rank_layout)
        seed = distributed.broadcast_object(torch.initial_seed())  # dp replicas must start alike
        stages = split_module_(pl_module, self.module, plan, grid.pipeline_rank, self.root_device, seed)
        rank_zero_info(f"pipeline_parallel: {grid.pipeline_size} ranks per pipeline, {grid.replicas} replica(s)\n"
                       f"{plan.describe(stack)}")  # fmt: skip
        self._runner = PipelineRunner(self._spec, plan, stages, grid.pipeline_rank, self.root_device, group,
                                      self.n_microbatches, loss_fn)  # fmt: skip

    # ------------------------------------------------------------------------------------------------ steps

    def _run(self, mode: Literal["train", "eval"], batch: Any) -> tuple[Tensor, int]:
        """The mean microbatch loss of ``batch`` (the same on every rank of the pipeline) and the batch size."""
        inputs, target = inputs_and_target(batch, getattr(self._module, "pipeline_split_batch", None))
        return self._pipeline.run(mode, inputs, target), len(inputs[0])

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        # The schedule runs backward already; Lightning's closure zeroes gradients between training_step and
        # backward, so this step's gradients wait outside the parameters until backward() puts them back.
        params = list(self._module.parameters())
        with self._stash.collecting(params), self.precision_plugin.train_step_context():
            loss, size = self._run("train", args[0])
        if self.log_train_loss == "every_step" or train_loss_read_this_step(self._module.trainer):
            self._module.log(TRAIN_LOSS, loss, prog_bar=True, batch_size=size)  # not free: only when read
        return loss.requires_grad_(True)  # every step, on every rank: on_train_batch_end's outputs

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        module = self._module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)  # on_before_backward hooks
        # scaled as Lightning scales a loss before backward
        self._stash.add_to(module.parameters(), scale=1.0 / module.trainer.accumulate_grad_batches)
        return self.precision_plugin.post_backward(closure_loss, module)  # on_after_backward hooks

    @override
    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        def closure_then_average() -> Any:
            result = closure()
            if self._grid.replicas > 1:  # pipeline replicas average their gradients, as DDP would
                grads = [p.grad for p in self._module.parameters() if p.grad is not None]
                distributed.all_reduce_mean_(grads, group=self._mesh.get_group("dp"))
            return result

        return super().optimizer_step(optimizer, closure_then_average, model, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Tensor:
        with self.precision_plugin.val_step_context():
            loss, size = self._run("eval", args[0])
        # every stage holds its replica's loss; the epoch value is the mean over replicas
        self._module.log("val_loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        return loss

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Tensor:
        with self.precision_plugin.test_step_context():
            loss, size = self._run("eval", args[0])
        self._module.log("test_loss", loss, batch_size=size, sync_dist=True)
        return loss

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        inputs = inputs_of(args[0], getattr(self._module, "pipeline_split_batch", None))
        with self.precision_plugin.predict_step_context():
            output = self._pipeline.predict(inputs)
        # on the CPU: a tensor pickled on one GPU would unpickle onto the same device index in every other process
        output = apply_to_collection(output, Tensor, lambda t: t.cpu())
        return distributed.broadcast_object(output, self._pipeline.last_stage_rank, group=self._mesh.get_group("pp"))

    @override
    def teardown(self) -> None:
        if self._runner is not None:
            self._runner.close()  # waits a while until the other ranks took the last loss sent
        self._unroute_clipping()
        super().teardown()

    # ------------------------------------------------------------------------------------------ checkpoints

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        return gather_model_state(self._module.state_dict(), self._mesh.get_group("pp"))  # the unsplit model's

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        module = self._module
        module.load_state_dict(stage_model_state(checkpoint["state_dict"], module.state_dict(), strict), strict=strict)

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        return gather_optimizer_state(super().optimizer_state(optimizer), self._mesh.get_group("pp"))

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        grid = self._grid
        own = stage_optimizer_states(checkpoint["optimizer_states"], grid.pipeline_size, grid.pipeline_rank)
        super().load_optimizer_state_dict({**checkpoint, "optimizer_states": own})


def train_loss_read_this_step(trainer: pl.Trainer) -> bool:
    """In ``training_step``: whether anything reads the ``train_loss`` logged at this step (see ``log_train_loss``)."""
    if trainer_fast_dev_run(trainer) or trainer_logs_this_step(trainer) or _monitored(trainer):
        return True
    epoch_loop = trainer.fit_loop.epoch_loop
    if is_last_batch_of_epoch(trainer) or 0 <= trainer.max_steps <= trainer.global_step + 1:
        return True  # read at epoch end (callbacks, the progress bar) and after fit
    bar = trainer.progress_bar_callback
    if bar is None or not getattr(bar, "is_enabled", True):
        return False
    if isinstance(bar, TQDMProgressBar):  # it shows the metrics when it refreshes, every refresh_rate batches
        return (epoch_loop.batch_idx + 1) % bar.refresh_rate == 0
    return True  # other bars (Rich) read the metrics after every batch


def _monitored(trainer: pl.Trainer) -> bool:
    """Whether a callback or an LR scheduler reads ``train_loss`` whenever it likes: its ``monitor``, or a checkpoint
    ``filename`` that formats it."""
    for callback in trainer_callbacks(trainer):
        if getattr(callback, "monitor", None) == TRAIN_LOSS or TRAIN_LOSS in str(getattr(callback, "filename", "")):
            return True
    return any(config.monitor == TRAIN_LOSS for config in trainer.lr_scheduler_configs)
