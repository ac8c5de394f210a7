"""``pipeline_parallel``: torch.distributed.pipelining schedules behind Lightning's Trainer."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Generator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.distributed.pipelining as pipelining
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale.errors import ConfigurationError
from lightning_scale.pipeline.clipping import clip_grad_norm_across_
from lightning_scale.pipeline.layout import checked_stack
from lightning_scale.pipeline.materialize import is_meta, materialize_
from lightning_scale.pipeline.split import LOOPED, V_SHAPE, StagePlan, plan_stages

__all__ = ["PipelineParallelStrategy"]


LOSS_TAG = 0x1055  # point-to-point tag of the loss sent from the last stage, apart from the schedule's transfers
LOSS_SEND_GRACE = timedelta(seconds=60)
log = logging.getLogger(__name__)
Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "zbv_zero_bubble"]
# name: (torch class, stages per rank it needs by default, how stages map to ranks, several stages per rank)
_PARALLEL_ARGUMENTS = {"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin",
                       "timeout", "start_method"}  # fmt: skip
"""``DDPStrategy`` arguments that apply to a pipeline too; the others configure DDP's wrapper, which it has not."""
_DDP_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(DistributedDataParallel.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}
"""The wrapper's arguments as they are when nobody sets them (the command line passes them all)."""

SCHEDULES: dict[str, tuple[type, int, str, bool]] = {
    "gpipe": (pipelining.ScheduleGPipe, 1, LOOPED, False),
    "1f1b": (pipelining.Schedule1F1B, 1, LOOPED, False),
    "interleaved_1f1b": (pipelining.ScheduleInterleaved1F1B, 2, LOOPED, True),
    "looped_bfs": (pipelining.ScheduleLoopedBFS, 2, LOOPED, True),
    "interleaved_zero_bubble": (pipelining.ScheduleInterleavedZeroBubble, 2, LOOPED, True),
    "zbv_zero_bubble": (pipelining.ScheduleZBVZeroBubble, 2, V_SHAPE, True),
}


class PipelineParallelStrategy(DDPStrategy):
    """Pipeline parallelism with torch's own schedules, registered as ``pipeline_parallel``.

    The LightningModule keeps its whole network, in order, in one ``nn.Sequential`` or ``nn.ModuleList`` (the
    attribute named by ``module``, default ``model``) and adds two methods:

    - ``pipeline_loss_fn(output, target) -> Tensor``: the loss of one microbatch, computed on the last stage;
    - ``pipeline_split_batch(batch) -> (inputs, target)`` (optional; default: a batch ``(inputs, target)``).

    Every trainable parameter must be inside the stack (an embedding as its first block, a head as its last): one
    outside would stay untrained, so it is refused before training, naming the parameters and a stack that holds them.

    Before the optimizers are built, the stack is split into ``pipeline_size x stages_per_rank`` stages balanced by
    parameter count; each rank keeps only its blocks, under their original names, so ``configure_optimizers`` sees
    the local parameters and checkpoints hold the unsplit model's keys. The strategy runs the schedule in place of
    the module's ``training_step``/``validation_step``/``test_step`` (forward-only for evaluation) and logs
    ``train_loss``, ``val_loss`` and ``test_loss``: the last stage's mean microbatch loss, sent to every rank,
    so the progress bar, checkpoint monitors and early stopping agree. With ``world_size = pipeline_size x dp``,
    ``dp`` pipeline replicas each read their own shard of the data and average gradients before each optimizer step.

    ``predict_step`` runs forward-only too and returns the stack's output for the batch's inputs (the whole batch
    when it is not an ``(inputs, target)`` pair or ``pipeline_split_batch`` is not defined) on every rank of the
    pipeline, on the CPU. A model built under ``Trainer.init_module(empty_init=True)`` lives on the meta device
    until the split: each rank then allocates only its own blocks and initialises them with their modules'
    ``reset_parameters()``, block ``i`` from seed ``torch.initial_seed() + i`` (rank 0's), so the weights do not
    depend on the layout.

    Gradient clipping by norm (``Trainer(gradient_clip_val=...)``) uses the norm over all stages' gradients.
    Checkpoints gather every stage's weights, so the saved ``state_dict`` loads strictly into the unsplit module on
    one device; the optimizer states are kept per pipeline rank and resume only with the same layout.

    Args:
        schedule: ``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``looped_bfs``, ``interleaved_zero_bubble`` or
            ``zbv_zero_bubble``.
        n_microbatches: Microbatches per batch; must divide the batch size.
        stages_per_rank: Stages (virtual stages) per rank: 1 for ``gpipe``/``1f1b``, default 2 for the others.
        pipeline_size: Ranks per pipeline (default: all); must divide the world size.
        module: Attribute of the LightningModule holding the stack of blocks.
        process_group_backend: ``gloo`` or ``nccl`` (default: by device).
        timeout: Timeout of collectives and point-to-point transfers.

    Example:
        >>> import lightning_scale  # registers the strategy
        >>> strategy = PipelineParallelStrategy(schedule="1f1b", n_microbatches=8)
    """

    strategy_name = "pipeline_parallel"

    def __init__(
        self,
        schedule: Schedule = "1f1b",
        n_microbatches: int = 4,
        stages_per_rank: int | None = None,
        pipeline_size: int | None = None,
        module: str = "model",
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ConfigurationError(
                f"schedule={schedule!r} is not one of {sorted(SCHEDULES)} (--trainer.strategy.schedule)."
            )
        _, default_stages, _, multi = SCHEDULES[schedule]
        stages_per_rank = default_stages if stages_per_rank is None else stages_per_rank
        if n_microbatches < 1:
            raise ConfigurationError(
                f"n_microbatches={n_microbatches} must be >= 1 (--trainer.strategy.n_microbatches)."
            )
        if stages_per_rank < 1 or (not multi and stages_per_rank != 1):
            raise ConfigurationError(
                f"stages_per_rank={stages_per_rank} does not fit schedule={schedule!r}: gpipe and 1f1b run one stage "
                "per rank; use interleaved_1f1b (or another looped schedule) for virtual stages."
            )
        if schedule == "zbv_zero_bubble" and stages_per_rank != 2:
            raise ConfigurationError(
                f"zbv_zero_bubble runs exactly 2 stages per rank (got stages_per_rank={stages_per_rank})."
            )
        if pipeline_size is not None and pipeline_size < 1:
            raise ConfigurationError(f"pipeline_size={pipeline_size} must be >= 1 (--trainer.strategy.pipeline_size).")
        if timeout is not None:
            kwargs["timeout"] = timeout
        ddp_only = {name for name, value in kwargs.items() if value != _DDP_DEFAULTS.get(name)} - _PARALLEL_ARGUMENTS
        if ddp_only:
            raise ConfigurationError(
                f"pipeline_parallel runs a pipeline schedule and does not wrap the model in DDP, so {sorted(ddp_only)} "
                "would do nothing: drop them (its replicas average their gradients themselves)."
            )
        super().__init__(process_group_backend=process_group_backend, **kwargs)
        self.schedule = schedule
        self.n_microbatches = n_microbatches
        self.stages_per_rank = stages_per_rank
        self.pipeline_size = pipeline_size
        self.module = module
        self._plan: StagePlan | None = None
        self._mesh: Any = None
        self._schedules: dict[tuple[str, int], Any] = {}
        self._pending_grads: list[Tensor | None] | None = None
        self._loss_sends: list[Any] = []

    # ----------------------------------------------------------------------------------------------- layout

    @property
    def _pp(self) -> int:
        return self.pipeline_size or self.world_size

    @property
    def _dp(self) -> int:
        return self.world_size // self._pp

    @property
    def _pp_rank(self) -> int:
        return self.global_rank % self._pp  # the (dp, pp) mesh is row major

    @property
    def _dp_rank(self) -> int:
        return self.global_rank // self._pp

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # every stage of one pipeline must see the same batches; pipeline replicas read different shards
        return {"num_replicas": self._dp, "rank": self._dp_rank}

    @override
    def setup_distributed(self) -> None:
        self.set_world_ranks()
        distributed.init_process_group_per_attempt(
            self._get_process_group_backend(), self.global_rank, self.world_size, self._timeout
        )
        super().setup_distributed()
        if self.world_size % self._pp:
            raise ConfigurationError(
                f"pipeline_size={self._pp} does not divide the world size {self.world_size}; choose a divisor "
                "(--trainer.strategy.pipeline_size), the rest becomes data parallel replicas."
            )
        self._mesh = distributed.device_mesh(self.root_device.type, (self._dp, self._pp), ("dp", "pp"))

    # ------------------------------------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        if self._plan is None:
            self._split(trainer.lightning_module)  # before the optimizers see the parameters
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        # Lightning clips through the precision plugin with each rank's own norm; the norm must span all stages
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm  # type: ignore[method-assign]

    @override
    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        # empty_init: build on the meta device; each rank allocates only its own blocks after the split
        with torch.device("meta") if empty_init else nullcontext(), self.precision_plugin.tensor_init_context():
            yield

    def _clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        group = self._mesh.get_group("pp")
        parameters = self.precision_plugin.main_params(optimizer)
        clip_grad_norm_across_(parameters, clip_val, lambda t: distributed.all_reduce_sum_(t, group=group))

    def _split(self, pl_module: pl.LightningModule) -> None:
        stack, frozen_outside = checked_stack(pl_module, self.module)
        if frozen_outside:
            rank_zero_warn(
                f"pipeline_parallel: frozen parameters outside {self.module!r} ({', '.join(frozen_outside[:6])}) are "
                "not part of the pipeline's forward, which runs the stack only; put their modules into the stack if "
                "forward() uses them."
            )
        if not callable(getattr(pl_module, "pipeline_loss_fn", None)):
            raise ConfigurationError(
                f"{type(pl_module).__name__} needs pipeline_loss_fn(output, target) -> Tensor: the loss of one "
                "microbatch, computed on the last pipeline stage."
            )
        _, _, style, _ = SCHEDULES[self.schedule]
        self._plan = plan_stages(stack, self._pp * self.stages_per_rank, self._pp, style)
        self._stage_modules = {
            stage: self._plan.stage_module(stack, stage) for stage in self._plan.local_stages(self._pp_rank)
        }
        local = self._plan.local_stack(stack, self._pp_rank)
        setattr(pl_module, self.module, local)
        seed = distributed.broadcast_object(torch.initial_seed())  # dp replicas must start alike
        materialize_(((self._plan.names.index(name), block) for name, block in local.named_children()),
                     self.root_device, seed)  # fmt: skip
        if is_meta(pl_module):
            raise ConfigurationError(
                f"{type(pl_module).__name__} has parts on the meta device outside {self.module!r}; build only the "
                "stack of blocks under Trainer.init_module(empty_init=True), or everything without it."
            )
        rank_zero_info(
            f"pipeline_parallel: {self._pp} ranks per pipeline, {self._dp} replica(s)\n{self._describe(stack)}"
        )

    def _describe(self, stack: Any) -> str:
        """One line per stage: its rank, blocks and parameter count (Lightning's ModelSummary shows rank 0's only)."""
        assert self._plan is not None
        blocks = dict(stack.named_children())
        lines = []
        for stage, ((start, stop), rank) in enumerate(zip(self._plan.bounds, self._plan.ranks, strict=True)):
            names = self._plan.names[start:stop]
            count = sum(p.numel() for name in names for p in blocks[name].parameters())
            lines.append(
                f"  stage {stage} on pipeline rank {rank}: blocks {names[0]}..{names[-1]}, {count:,} parameters"
            )
        return "\n".join(lines)

    def _schedule_for(self, mode: str, batch_size: int) -> Any:
        """One schedule (with its own stages) per mode and batch size: stages fix their shapes on first use."""
        key = (mode, batch_size)
        if key not in self._schedules:
            assert self._plan is not None
            cls, _, _, multi = SCHEDULES[self.schedule]
            group = self._mesh.get_group("pp")
            stages = [
                pipelining.PipelineStage(module, stage, len(self._plan.bounds), self.root_device, group=group)
                for stage, module in self._stage_modules.items()
            ]
            loss_fn = None if mode == "predict" else self.lightning_module.pipeline_loss_fn
            schedule = cls(stages if multi else stages[0], self.n_microbatches, loss_fn=loss_fn)
            if mode != "train" and SCHEDULES[self.schedule][2] == V_SHAPE:
                _drop_backward_actions(schedule)
            self._schedules[key] = schedule
        return self._schedules[key]

    # ------------------------------------------------------------------------------------------------ steps

    def _run(self, mode: str, batch: Any) -> tuple[Tensor, int]:
        """Run ``batch`` through the pipeline (``train`` or ``eval``); the mean microbatch loss (the same on every rank
        of the pipeline) and the batch size.

        The loss goes from the last stage to the others point to point, the receive posted before the schedule runs:
        it arrives while the first stage still runs its final backward, so no rank waits for it. A broadcast held the
        last stage until the first one finished that backward, which pushed the last stage's optimizer step into the
        next step's critical path (~9 ms a step at D=1024, m=8 on 2 CPU processes); a receive posted after the
        schedule cost the first stage ~0.5 ms a step."""
        inputs, target = self._split_batch(batch)
        self._check_divisible(len(inputs[0]))  # before anything is posted: every rank raises alike
        group = self._mesh.get_group("pp")
        loss = torch.zeros((), device=self.root_device)
        last = self._runs_stage(-1)
        receiving = [] if last else distributed.start_receive(loss, self._last_stage_rank(), group, tag=LOSS_TAG)
        losses: list[Tensor] = []
        self._pipeline(mode, inputs, target=target if last else None, losses=losses if last else None)
        if last:
            loss = torch.stack(losses).mean().detach().float()
            for send in self._loss_sends:  # the previous step's: every receiver took it before starting this step
                send.wait()
            self._loss_sends = distributed.send_to_others(loss.clone(), group=group, tag=LOSS_TAG)
        for receive in receiving:
            receive.wait()
        return loss, len(inputs[0])

    def _check_divisible(self, size: int) -> None:
        if size % self.n_microbatches:
            divisors = [d for d in range(2, min(size, 64) + 1) if size % d == 0][:4]
            raise ConfigurationError(
                f"n_microbatches={self.n_microbatches} does not divide the batch size {size}; choose a divisor such "
                f"as {divisors} (--trainer.strategy.n_microbatches), or a batch size that it divides."
            )

    def _pipeline(self, mode: str, inputs: tuple[Tensor, ...], **kwargs: Any) -> Any:
        schedule = self._schedule_for(mode, inputs[0].shape[0])
        args = inputs if self._runs_stage(0) else ()
        if mode == "train":
            return schedule.step(*args, return_outputs=False, **kwargs)
        return schedule.eval(*args, return_outputs=mode == "predict", **kwargs)

    def _runs_stage(self, stage: int) -> bool:
        assert self._plan is not None
        return self._plan.ranks[stage] == self._pp_rank

    def _last_stage_rank(self) -> int:
        assert self._plan is not None
        return distributed.global_rank_in(self._mesh.get_group("pp"), self._plan.ranks[-1])

    def _split_batch(self, batch: Any) -> tuple[tuple[Tensor, ...], Tensor]:
        split: Callable[[Any], Any] | None = getattr(self.lightning_module, "pipeline_split_batch", None)
        if split is not None:
            inputs, target = split(batch)
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            inputs, target = batch
        else:
            raise ConfigurationError(
                f"pipeline_parallel cannot tell inputs from target in a batch of type {type(batch).__name__}; define "
                "pipeline_split_batch(batch) -> (inputs, target) on the LightningModule."
            )
        return (inputs if isinstance(inputs, tuple) else (inputs,)), target

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        params = list(self.lightning_module.parameters())
        earlier = [p.grad for p in params]  # gradients accumulated so far stay out of this step's backward
        for p in params:
            p.grad = None
        with self.precision_plugin.train_step_context():
            loss, size = self._run("train", args[0])
        # The schedule ran backward already; Lightning's closure zeroes gradients between training_step and
        # backward, so this step's gradients wait outside the parameters until backward() puts them back.
        self._pending_grads = [p.grad for p in params]
        for p, grad in zip(params, earlier, strict=True):
            p.grad = grad
        self.lightning_module.log("train_loss", loss, prog_bar=True, batch_size=size)
        return loss.requires_grad_(True)

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)  # on_before_backward hooks
        scale = 1.0 / module.trainer.accumulate_grad_batches  # as Lightning scales a loss before backward
        for p, grad in zip(module.parameters(), self._pending_grads or [], strict=True):
            if grad is None:
                continue
            if p.grad is None:  # no copy: the stashed tensor becomes the gradient
                p.grad = grad if scale == 1.0 else grad.mul_(scale)
            else:
                p.grad.add_(grad, alpha=scale)
        self._pending_grads = None
        return self.precision_plugin.post_backward(closure_loss, module)  # on_after_backward hooks

    @override
    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        def closure_then_average() -> Any:
            result = closure()
            if self._dp > 1:  # pipeline replicas average their gradients, as DDP would
                grads = [p.grad for p in self.lightning_module.parameters() if p.grad is not None]
                distributed.all_reduce_mean_(grads, group=self._mesh.get_group("dp"))
            return result

        return super().optimizer_step(optimizer, closure_then_average, model, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Tensor:
        with self.precision_plugin.val_step_context():
            loss, size = self._run("eval", args[0])
        # every stage holds its replica's loss; the epoch value is the mean over replicas
        self.lightning_module.log("val_loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        return loss

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Tensor:
        with self.precision_plugin.test_step_context():
            loss, size = self._run("eval", args[0])
        self.lightning_module.log("test_loss", loss, batch_size=size, sync_dist=True)
        return loss

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        batch = args[0]
        split = getattr(self.lightning_module, "pipeline_split_batch", None)
        if split is not None:
            inputs = split(batch)[0]
        else:
            inputs = batch[0] if isinstance(batch, (tuple, list)) and len(batch) == 2 else batch
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        self._check_divisible(len(inputs[0]))
        with self.precision_plugin.predict_step_context():
            output = self._pipeline("predict", inputs)
        # on the CPU: a tensor pickled on one GPU would unpickle onto the same device index in every other process
        output = apply_to_collection(output, Tensor, lambda t: t.cpu())
        return distributed.broadcast_object(output, self._last_stage_rank(), group=self._mesh.get_group("pp"))

    @override
    def teardown(self) -> None:
        # The last loss sent completes when its receivers take it, within the same step; leaving before that would
        # strand them. A receiver that failed never takes it: give up after a while, the job is ending anyway.
        sends, self._loss_sends = self._loss_sends, []
        for send in sends:
            try:
                send.wait(timeout=LOSS_SEND_GRACE)
            except RuntimeError as err:
                log.warning("pipeline_parallel: a pipeline rank did not take the last loss sent to it (%s)", err)
        super().teardown()

    # ------------------------------------------------------------------------------------------ checkpoints

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        parts = distributed.all_gather_object(self.lightning_module.state_dict(), group=self._mesh.get_group("pp"))
        merged: dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        return merged  # the unsplit model's state dict

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        local = self.lightning_module.state_dict()
        missing = [key for key in local if key not in checkpoint["state_dict"]]
        if strict and missing:
            raise KeyError(f"The checkpoint lacks {missing[:5]} of this pipeline stage; was it written by this model?")
        state = {key: value for key, value in checkpoint["state_dict"].items() if key in local}
        self.lightning_module.load_state_dict(state, strict=strict)

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        local = super().optimizer_state(optimizer)
        return {"pipeline_ranks": distributed.all_gather_object(local, group=self._mesh.get_group("pp"))}

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        states = [state["pipeline_ranks"] for state in checkpoint["optimizer_states"]]
        if any(len(ranks) != self._pp for ranks in states):
            raise ConfigurationError(
                f"The checkpoint's optimizer states come from {len(states[0])} pipeline ranks, this run has "
                f"{self._pp}; resume with the same pipeline_size, or load only the weights (the unsplit state_dict)."
            )
        own = {**checkpoint, "optimizer_states": [ranks[self._pp_rank] for ranks in states]}
        super().load_optimizer_state_dict(own)


def _drop_backward_actions(schedule: Any) -> None:
    """Make a V-shaped schedule forward-only: torch 2.13's ``eval()`` still runs its backward actions, and the one
    that hands a gradient to the neighbouring stage on the same rank fails (guarded by the zbv predict test)."""
    forward = ("F", "SEND_F", "RECV_F")  # torch's _ComputationType values (a str Enum)
    schedule.pipeline_order_with_comms = {
        rank: [action for action in actions if action is not None and action.computation_type in forward]
        for rank, actions in schedule.pipeline_order_with_comms.items()
    }
