"""The pipeline engine (no Lightning): torch's schedules by name, splitting a stack into stages, meta-block
materialisation, the step runner, the gradient stash, cross-stage clipping and checkpoint state gather/split."""

from lightning_scale.parallel.pipeline.batch import inputs_and_target, inputs_of, loss_fn_of
from lightning_scale.parallel.pipeline.clipping import clip_grad_norm_across_
from lightning_scale.parallel.pipeline.ddp_arguments import refuse_wrapper_arguments
from lightning_scale.parallel.pipeline.gradients import GradientStash
from lightning_scale.parallel.pipeline.grid import PipelineGrid
from lightning_scale.parallel.pipeline.layout import checked_stack
from lightning_scale.parallel.pipeline.materialize import is_meta, materialize_
from lightning_scale.parallel.pipeline.runner import PipelineRunner
from lightning_scale.parallel.pipeline.schedules import (
    SCHEDULES,
    ScheduleName,
    ScheduleSpec,
    build_schedule,
    schedule_spec,
)
from lightning_scale.parallel.pipeline.split import (
    StagePlan,
    balanced_partition,
    plan_stages,
    split_module_,
    stage_ranks,
)
from lightning_scale.parallel.pipeline.state import (
    gather_model_state,
    gather_optimizer_state,
    stage_model_state,
    stage_optimizer_states,
)

__all__ = [
    "SCHEDULES",
    "GradientStash",
    "PipelineGrid",
    "PipelineRunner",
    "ScheduleName",
    "ScheduleSpec",
    "StagePlan",
    "balanced_partition",
    "build_schedule",
    "checked_stack",
    "clip_grad_norm_across_",
    "gather_model_state",
    "gather_optimizer_state",
    "inputs_and_target",
    "inputs_of",
    "is_meta",
    "loss_fn_of",
    "materialize_",
    "plan_stages",
    "refuse_wrapper_arguments",
    "schedule_spec",
    "split_module_",
    "stage_model_state",
    "stage_optimizer_states",
    "stage_ranks",
]
