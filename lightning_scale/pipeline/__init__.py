"""Pipeline parallelism: splitting a stack into stages, materialising meta blocks (plain logic, no Lightning)."""

from lightning_scale.pipeline.materialize import is_meta, materialize_
from lightning_scale.pipeline.split import StagePlan, balanced_partition, plan_stages, stage_ranks

__all__ = ["StagePlan", "balanced_partition", "is_meta", "materialize_", "plan_stages", "stage_ranks"]
