"""Pipeline parallelism: splitting a stack of blocks into stages (plain logic, no Lightning imports)."""

from lightning_scale.pipeline.split import StagePlan, balanced_partition, plan_stages, stage_ranks

__all__ = ["StagePlan", "balanced_partition", "plan_stages", "stage_ranks"]
