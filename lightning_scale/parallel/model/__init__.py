"""Model parallel building blocks: the automatic FSDP2 sharding policy and the default tensor-parallel plan
(no Lightning imports)."""

from lightning_scale.parallel.model.policy import (
    ShardingPolicyError,
    apply_fsdp,
    apply_tensor_parallel,
    default_tensor_parallel_plan,
    is_parallelized,
    sharding_units,
)

__all__ = [
    "ShardingPolicyError",
    "apply_fsdp",
    "apply_tensor_parallel",
    "default_tensor_parallel_plan",
    "is_parallelized",
    "sharding_units",
]
