"""Running one batch through this rank's stages of a pipeline, and handing the loss to every rank of it. No Lightning
here: a test drives it with a process group and modules alone."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_scale import distributed
from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.pipeline.schedules import ScheduleSpec, build_schedule
from lightning_scale.parallel.pipeline.split import StagePlan

__all__ = ["LOSS_SEND_GRACE", "LOSS_TAG", "PipelineRunner"]

LOSS_TAG = 0x1055  # point-to-point tag of the loss sent from the last stage, apart from the schedule's transfers
LOSS_SEND_GRACE = timedelta(seconds=60)
log = logging.getLogger(__name__)

Mode = Literal["train", "eval", "predict"]


class PipelineRunner:
    """Runs batches through one rank's stages with a torch schedule, one schedule per mode and batch size.

    Args:
        spec: The schedule to run.
        plan: Which blocks form each stage and which pipeline rank runs it.
        stage_modules: This rank's stages: ``{stage index: module}`` (``plan.stage_module`` of each local stage).
        pipeline_rank: This rank's place in the pipeline (its rank in ``group``).
        device: Where the stages compute.
        group: The pipeline's process group.
        n_microbatches: Microbatches per batch; must divide every batch size.
        loss_fn: The loss of one microbatch ``(output, target) -> Tensor``, computed on the last stage.

    Examples:
        >>> import torch.distributed as dist
        >>> from lightning_scale.parallel.pipeline import SCHEDULES, plan_stages
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> stack = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> plan = plan_stages(stack, num_stages=1, pipeline_size=1, style="looped")
        >>> runner = PipelineRunner(SCHEDULES["1f1b"], plan, {0: stack}, 0, torch.device("cpu"), dist.group.WORLD,
        ...                         n_microbatches=2, loss_fn=nn.functional.cross_entropy)
        >>> loss = runner.run("train", (torch.randn(4, 4),), torch.tensor([0, 1, 0, 1]))
        >>> runner.close()
        >>> dist.destroy_process_group()
    """

    def __init__(
        self,
        spec: ScheduleSpec,
        plan: StagePlan,
        stage_modules: Mapping[int, nn.Module],
        pipeline_rank: int,
        device: torch.device,
        group: Any,
        n_microbatches: int,
        loss_fn: Callable[[Any, Any], Tensor],
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.stage_modules = stage_modules
        self.pipeline_rank = pipeline_rank
        self.device = device
        self.group = group
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn
        self._schedules: dict[tuple[Mode, int], Any] = {}
        self._loss_sends: list[Any] = []

    def runs_stage(self, stage: int) -> bool:
        """Whether this rank runs ``stage`` (negative: counted from the last)."""
        return self.plan.ranks[stage] == self.pipeline_rank

    @property
    def last_stage_rank(self) -> int:
        """The global rank that runs the last stage."""
        return distributed.global_rank_in(self.group, self.plan.ranks[-1])

    def check_divisible(self, size: int) -> None:
        """Refuse a batch of ``size`` rows that ``n_microbatches`` does not divide, naming divisors that would."""
        if size % self.n_microbatches:
            divisors = [d for d in range(2, min(size, 64) + 1) if size % d == 0][:4]
            raise ConfigurationError(
                f"n_microbatches={self.n_microbatches} does not divide the batch size {size}; choose a divisor such "
                f"as {divisors} (--trainer.strategy.n_microbatches), or a batch size that it divides."
            )

    def run(self, mode: Literal["train", "eval"], inputs: tuple[Tensor, ...], target: Tensor) -> Tensor:
        """Run a batch through the pipeline (``train``: forward and backward, ``eval``: forward only); returns the mean
        microbatch loss, the same on every rank of the pipeline.

        The loss goes from the last stage to the others point to point, the receive posted before the schedule runs:
        it arrives while the first stage still runs its final backward, so no rank waits for it. A broadcast held the
        last stage until the first one finished that backward, which pushed the last stage's optimizer step into the
        next step's critical path (~9 ms a step at D=1024, m=8 on 2 CPU processes); a receive posted after the
        schedule cost the first stage ~0.5 ms a step."""
        self.check_divisible(len(inputs[0]))  # before anything is posted: every rank raises alike
        loss = torch.zeros((), device=self.device)
        last = self.runs_stage(-1)
        receiving = [] if last else distributed.start_receive(loss, self.last_stage_rank, self.group, tag=LOSS_TAG)
        losses: list[Tensor] = []
        self._pipeline(mode, inputs, target=target if last else None, losses=losses if last else None)
        if last:
            loss = torch.stack(losses).mean().detach().float()
            for send in self._loss_sends:  # the previous step's: every receiver took it before starting this step
                send.wait()
            self._loss_sends = distributed.send_to_others(loss.clone(), group=self.group, tag=LOSS_TAG)
        for receive in receiving:
            receive.wait()
        return loss

    def predict(self, inputs: tuple[Tensor, ...]) -> Any:
        """Run ``inputs`` forward only; the stack's output on the rank of the last stage (``None`` on the others)."""
        self.check_divisible(len(inputs[0]))
        return self._pipeline("predict", inputs)

    def close(self, grace: timedelta = LOSS_SEND_GRACE) -> None:
        """Wait, up to ``grace``, until the other ranks took the last loss sent; safe to call twice.

        The last loss sent completes when its receivers take it, within the same step; leaving before that would
        strand them. A receiver that failed never takes it: give up after a while, the job is ending anyway."""
        sends, self._loss_sends = self._loss_sends, []
        for send in sends:
            try:
                send.wait(timeout=grace)
            except RuntimeError as err:
                log.warning("pipeline_parallel: a pipeline rank did not take the last loss sent to it (%s)", err)

    def _pipeline(self, mode: Mode, inputs: tuple[Tensor, ...], **kwargs: Any) -> Any:
        schedule = self._schedule_for(mode, inputs[0].shape[0])
        args = inputs if self.runs_stage(0) else ()
        if mode == "train":
            return schedule.step(*args, return_outputs=False, **kwargs)
        return schedule.eval(*args, return_outputs=mode == "predict", **kwargs)

    def _schedule_for(self, mode: Mode, batch_size: int) -> Any:
        """One schedule (with its own stages) per mode and batch size: stages fix their shapes on first use."""
        key = (mode, batch_size)
        if key not in self._schedules:
            self._schedules[key] = build_schedule(
                self.spec,
                self.stage_modules,
                len(self.plan.bounds),
                self.device,
                self.group,
                self.n_microbatches,
                loss_fn=None if mode == "predict" else self.loss_fn,
                forward_only=mode != "train",
            )
        return self._schedules[key]
