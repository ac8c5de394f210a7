"""torch's pipeline schedules by name: what each needs (a named spec) and how one is built over a rank's stages.

No Lightning here; torch.distributed.pipelining is torch's own communication engine (point-to-point transfers inside
``PipelineStage``), built here, not collectives called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed.pipelining as pipelining
from torch import Tensor, nn

from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.pipeline.split import LOOPED, V_SHAPE

__all__ = ["SCHEDULES", "ScheduleName", "ScheduleSpec", "build_schedule", "schedule_spec"]

ScheduleName = Literal["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "zbv_zero_bubble"]


@dataclass(frozen=True)
class ScheduleSpec:
    """What one of torch's schedules needs from the pipeline around it.

    Examples:
        >>> SCHEDULES["interleaved_1f1b"].stages_per_rank(None)
        2
    """

    name: str  # the strategy's name for it (``--trainer.strategy.schedule``)
    torch_class: type  # the torch.distributed.pipelining schedule class
    default_stages_per_rank: int  # stages per rank when the user sets none
    rank_layout: str  # how stages map to pipeline ranks: ``LOOPED`` (round robin) or ``V_SHAPE`` (there and back)
    multi_stage: bool  # whether it runs several stages per rank (takes a list of stages)

    def stages_per_rank(self, requested: int | None) -> int:
        """``requested`` (default: this schedule's), checked against what the schedule runs."""
        stages = self.default_stages_per_rank if requested is None else requested
        if stages < 1 or (not self.multi_stage and stages != 1):
            raise ConfigurationError(
                f"stages_per_rank={stages} does not fit schedule={self.name!r}: gpipe and 1f1b run one stage "
                "per rank; use interleaved_1f1b (or another looped schedule) for virtual stages."
            )
        if self.rank_layout == V_SHAPE and stages != 2:
            raise ConfigurationError(f"{self.name} runs exactly 2 stages per rank (got stages_per_rank={stages}).")
        return stages


SCHEDULES: dict[str, ScheduleSpec] = {
    spec.name: spec
    for spec in (
        ScheduleSpec("gpipe", pipelining.ScheduleGPipe, 1, LOOPED, multi_stage=False),
        ScheduleSpec("1f1b", pipelining.Schedule1F1B, 1, LOOPED, multi_stage=False),
        ScheduleSpec("interleaved_1f1b", pipelining.ScheduleInterleaved1F1B, 2, LOOPED, multi_stage=True),
        ScheduleSpec("looped_bfs", pipelining.ScheduleLoopedBFS, 2, LOOPED, multi_stage=True),
        ScheduleSpec("interleaved_zero_bubble", pipelining.ScheduleInterleavedZeroBubble, 2, LOOPED, multi_stage=True),
        ScheduleSpec("zbv_zero_bubble", pipelining.ScheduleZBVZeroBubble, 2, V_SHAPE, multi_stage=True),
    )
}


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec of the schedule called ``name``; refuses an unknown name, listing the known ones."""
    if name not in SCHEDULES:
        raise ConfigurationError(f"schedule={name!r} is not one of {sorted(SCHEDULES)} (--trainer.strategy.schedule).")
    return SCHEDULES[name]


def build_schedule(
    spec: ScheduleSpec,
    stage_modules: Mapping[int, nn.Module],
    num_stages: int,
    device: torch.device,
    group: Any,
    n_microbatches: int,
    loss_fn: Callable[[Any, Any], Tensor] | None,
    forward_only: bool,
) -> Any:
    """A ``spec`` schedule over this rank's stages (``{stage index: module}``) of a pipeline of ``num_stages``.

    Each call builds new ``PipelineStage``s: stages fix their shapes on first use, so each batch size needs its own.
    ``forward_only`` schedules run ``eval()`` only (``loss_fn`` ``None`` for outputs without a loss).
    """
    stages = [
        pipelining.PipelineStage(module, stage, num_stages, device, group=group)
        for stage, module in stage_modules.items()
    ]
    schedule = spec.torch_class(stages if spec.multi_stage else stages[0], n_microbatches, loss_fn=loss_fn)
    if forward_only and spec.rank_layout == V_SHAPE:
        _drop_backward_actions(schedule)
    return schedule


def _drop_backward_actions(schedule: Any) -> None:
    """Make a V-shaped schedule forward-only: torch 2.13's ``eval()`` still runs its backward actions, and the one
    that hands a gradient to the neighbouring stage on the same rank fails (guarded by the zbv predict test)."""
    forward = ("F", "SEND_F", "RECV_F")  # torch's _ComputationType values (a str Enum)
    schedule.pipeline_order_with_comms = {
        rank: [action for action in actions if action is not None and action.computation_type in forward]
        for rank, actions in schedule.pipeline_order_with_comms.items()
    }
