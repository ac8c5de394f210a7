"""Pipeline parallelism: checking and splitting a stack into stages, materialising meta blocks (no Lightning)."""

from lightning_scale.pipeline.layout import checked_stack
from lightning_scale.pipeline.materialize import is_meta, materialize_
from lightning_scale.pipeline.split import StagePlan, balanced_partition, plan_stages, stage_ranks

__all__ = ["StagePlan", "balanced_partition", "checked_stack", "is_meta", "materialize_", "plan_stages", "stage_ranks"]
