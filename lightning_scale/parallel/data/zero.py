"""ZeRO stage 1: each rank keeps the optimizer state of its share of the parameters (torch's
``ZeroRedundancyOptimizer``); the state of a sharded checkpoint, in which each rank saves its own share; and the bytes
a rank holds for training, counted from tensor sizes."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

__all__ = [
    "SHARDS_KEY",
    "own_share",
    "shard_optimizer",
    "sharded_state_dict",
    "training_state_bytes",
    "whole_state_dict",
]

SHARDS_KEY = "lightning_scale_zero_shards"
"""Key of a ZeRO optimizer's state dict, in a sharded checkpoint, that holds each rank's share of the state."""


def _is_zero(optimizer: Optimizer) -> bool:
    # torch.distributed.optim takes ~0.25 s to import: only when ZeRO is used (no optimizer can be one before that)
    module = sys.modules.get("torch.distributed.optim")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


def shard_optimizer(optimizer: Optimizer) -> ZeroRedundancyOptimizer:
    """The same optimizer (class, parameter groups, hyperparameters) with its state sharded across the ranks.

    Call it before the optimizer has taken a step: its state, if any, is not carried over.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer
    if optimizer.state:
        raise ValueError(f"{type(optimizer).__name__} already holds state; shard it before its first step.")
    cls = type(optimizer)
    # defaults the constructor accepts (AdamW's include Adam's decoupled_weight_decay, which AdamW's __init__ refuses);
    # every parameter group carries its own values anyway
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {name: value for name, value in optimizer.defaults.items() if name in accepted}
    return ZeroRedundancyOptimizer(optimizer.param_groups, optimizer_class=cls, **defaults)


def sharded_state_dict(optimizer: ZeroRedundancyOptimizer, shards: Any) -> dict[str, Any]:
    """The optimizer's state dict as each rank saves it without a collective: its parameter groups (hyperparameters,
    every parameter's index), and under :data:`SHARDS_KEY` ``shards``, which the caller builds from this rank's share
    :func:`own_share` (``per_rank``: one entry per rank). :func:`whole_state_dict` turns it into the consolidated
    state dict ``ZeroRedundancyOptimizer.state_dict()`` would give, which any optimizer of the same parameters
    loads."""
    groups, start = [], 0
    for group in optimizer.param_groups:
        count = len(group["params"])
        hyperparameters = {key: value for key, value in group.items() if key != "params"}
        groups.append({**hyperparameters, "params": list(range(start, start + count))})
        start += count
    return {"state": {}, "param_groups": groups, SHARDS_KEY: shards}


def own_share(optimizer: ZeroRedundancyOptimizer) -> dict[int, Any]:
    """This rank's share of the optimizer state, keyed by each parameter's index in the whole optimizer (the
    consolidated state dict's keys)."""
    index = {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    local = optimizer.optim
    return {index[id(p)]: local.state[p] for group in local.param_groups for p in group["params"] if p in local.state}


def whole_state_dict(state: dict[str, Any], only_rank: int | None = None) -> dict[str, Any]:
    """The consolidated optimizer state dict of a :func:`sharded_state_dict` (other state dicts are returned as they
    are). ``only_rank``: take that saving rank's share only (a ZeRO optimizer of the same world size needs no
    other: the partition is the same)."""
    if SHARDS_KEY not in state:
        return state
    shards: Sequence[dict[int, Any]] = state[SHARDS_KEY]
    merged: dict[int, Any] = {}
    for rank in range(len(shards)) if only_rank is None else [only_rank]:
        merged.update(shards[rank])
    whole = {key: value for key, value in state.items() if key != SHARDS_KEY}
    return {**whole, "state": dict(sorted(merged.items()))}


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor holds its shard only
        total += local.numel() * local.element_size()
    return total


def training_state_bytes(module: nn.Module, optimizers: Iterable[Optimizer]) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (ZeRO: its own shard of the state)."""
    state = []
    for optimizer in optimizers:
        local = optimizer.optim if _is_zero(optimizer) else optimizer  # type: ignore[attr-defined]
        state += [v for per_param in local.state.values() for v in per_param.values() if isinstance(v, torch.Tensor)]
    parameters = list(module.parameters())
    return {
        "parameters": _bytes(parameters),
        "gradients": _bytes(p.grad for p in parameters if p.grad is not None),
        "optimizer": _bytes(state),
    }
