"""Which modules FSDP2 shards as units, and which Linear layers tensor parallelism splits, for a plain model.

- Sharding units: every block of every ``nn.ModuleList`` (transformer layers, residual blocks); without a
  ``ModuleList``, every direct child holding at least ``min_params`` parameters. The root is sharded last and holds
  whatever is left (embeddings, norms, heads), as torchtitan applies ``fully_shard``.
- Tensor-parallel plan: inside each unit, two consecutive ``nn.Linear`` in an ``nn.Sequential`` whose widths chain
  (``first.out_features == second.in_features``) with only parameter-free modules between them (an MLP) become
  column-parallel then row-parallel: one all-reduce per MLP, and the same result as unsplit. An attention module built
  from separate query/key/value ``nn.Linear`` children (named ``q``/``q_proj``/``wq``/``query``, and alike for key and
  value) and an output one (``o``/``o_proj``/``wo``/``out_proj``) gets its query/key/value column-parallel (each rank
  computes a share of the heads) and its output row-parallel; its forward must take the number of heads from the
  projection's width (``view(batch, seq, -1, head_dim)``), as torchtitan's models do. Fused projections
  (``nn.MultiheadAttention``, a single ``qkv`` Linear) and every other module stay replicated across the
  tensor-parallel ranks unless a user plan says otherwise.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from lightning_scale.errors import ConfigurationError

__all__ = [
    "ShardingPolicyError",
    "apply_fsdp",
    "apply_tensor_parallel",
    "default_tensor_parallel_plan",
    "is_parallelized",
    "sharding_units",
]


class ShardingPolicyError(ConfigurationError):
    """The automatic policy found nothing worth sharding in the model."""


def sharding_units(module: nn.Module, min_params: int) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of each unit to shard before the root, in model order."""
    units = [
        (f"{name}.{index}" if name else str(index), block)
        for name, child in module.named_modules()
        if isinstance(child, nn.ModuleList)
        for index, block in enumerate(child)
        if any(True for _ in block.parameters())
    ]
    if not units:
        units = [
            (name, child)
            for name, child in module.named_children()
            if sum(p.numel() for p in child.parameters()) >= min_params
        ]
    if not units:
        largest = max((sum(p.numel() for p in c.parameters()) for c in module.children()), default=0)
        raise ShardingPolicyError(
            f"{type(module).__name__} has no nn.ModuleList of blocks and no child with >= min_params_to_shard="
            f"{min_params} parameters (the largest has {largest}); lower min_params_to_shard "
            "(--trainer.strategy.min_params_to_shard) or apply fully_shard yourself in configure_model()."
        )
    return units


def _mlp_pairs(sequential: nn.Sequential) -> list[tuple[str, str]]:
    children = list(sequential.named_children())
    pairs: list[tuple[str, str]] = []
    for i, (first_name, first) in enumerate(children):
        if not isinstance(first, nn.Linear) or any(first_name == second for _, second in pairs):
            continue  # a Linear that closes one pair does not open the next (its output is replicated)
        for second_name, second in children[i + 1 :]:
            if isinstance(second, nn.Linear):
                if first.out_features == second.in_features:
                    pairs.append((first_name, second_name))
                break
            if any(True for _ in second.parameters()):  # a norm or another weighted layer between: not an MLP
                break
    return pairs


_ATTENTION_NAMES = {
    "q": ("q", "q_proj", "wq", "query"),
    "k": ("k", "k_proj", "wk", "key"),
    "v": ("v", "v_proj", "wv", "value"),
    "o": ("o", "o_proj", "wo", "out_proj"),
}


def _attention_projections(module: nn.Module) -> dict[str, str] | None:
    """``{"q": child name, "k": ..., "v": ..., "o": ...}`` when ``module`` has separate Linear projections."""
    linears = {name: child for name, child in module.named_children() if isinstance(child, nn.Linear)}
    found = {}
    for role, names in _ATTENTION_NAMES.items():
        match = [name for name in names if name in linears]
        if len(match) != 1:
            return None
        found[role] = match[0]
    return found


def default_tensor_parallel_plan(module: nn.Module, units: list[tuple[str, nn.Module]]) -> dict[str, Any]:
    """``{module name: ColwiseParallel() | RowwiseParallel()}`` for ``parallelize_module(module, tp_mesh, plan)``."""
    plan: dict[str, Any] = {}
    for unit_name, unit in units:
        for name, child in unit.named_modules():
            prefix = ".".join(part for part in (unit_name, name) if part)
            if isinstance(child, nn.Sequential):
                for first, second in _mlp_pairs(child):
                    plan[f"{prefix}.{first}"] = ColwiseParallel()
                    plan[f"{prefix}.{second}"] = RowwiseParallel()
            projections = _attention_projections(child)
            if projections is not None:
                for role in ("q", "k", "v"):
                    plan[f"{prefix}.{projections[role]}"] = ColwiseParallel()
                plan[f"{prefix}.{projections['o']}"] = RowwiseParallel()
    return plan


def apply_tensor_parallel(module: nn.Module, tp_mesh: Any, plan: dict[str, Any]) -> None:
    """Split the modules named in ``plan`` across ``tp_mesh`` (before FSDP2, as torchtitan orders it)."""
    if not plan:
        raise ShardingPolicyError(
            f"tensor parallelism found nothing to split in {type(module).__name__}: no nn.Sequential with two chained "
            "nn.Linear and no attention with separate q/k/v/o nn.Linear inside its blocks. Define "
            "tensor_parallel_plan() on the LightningModule, or use tensor_parallel_size=1."
        )
    parallelize_module(module, tp_mesh, plan)


def apply_fsdp(module: nn.Module, units: list[tuple[str, nn.Module]], dp_mesh: Any) -> None:
    """``fully_shard`` each unit, innermost first (nested lists of blocks), then the root (which keeps the parameters
    outside every unit)."""
    for _, unit in sorted(units, key=lambda named: -named[0].count(".")):
        fully_shard(unit, mesh=dp_mesh)
    fully_shard(module, mesh=dp_mesh)


def is_parallelized(module: nn.Module) -> bool:
    """Whether FSDP2 was applied already (a second ``setup``, e.g. ``trainer.test`` after ``trainer.fit``)."""
    return isinstance(module, FSDPModule)
