"""ZeRO stage 1: each rank keeps the optimizer state of its share of the parameters (torch's
``ZeroRedundancyOptimizer``), and the bytes a rank holds for training, counted from tensor sizes."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

__all__ = ["shard_optimizer", "training_state_bytes"]


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
