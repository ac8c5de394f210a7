"""The optimizer state of a ZeRO run in checkpoints: each rank saves its own chunks, with no collective; merging the
ranks' chunks gives the state dict an unsharded optimizer of the same parameters has (any strategy loads it), and
cutting that again gives any world size its chunks. Also the bytes a rank holds for training, from tensor sizes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from lightning_scale.parallel.data.zero import ZeroSharding

__all__ = [
    "SHARDS_KEY",
    "chunked_state_dict",
    "own_chunks",
    "sharded_state_dict",
    "training_state_bytes",
    "whole_state_dict",
]

SHARDS_KEY = "lightning_scale_zero_shards"
"""Key of a ZeRO optimizer's state dict, in a sharded checkpoint, that holds each rank's share of the state."""

_CHUNKS = "chunks"


def sharded_state_dict(optimizer: Optimizer, shards: Any) -> dict[str, Any]:
    """The optimizer's state dict as each rank saves it without a collective: its parameter groups (hyperparameters,
    every parameter's index), and under :data:`SHARDS_KEY` ``shards``, which the caller builds from this rank's
    :func:`own_chunks` (``per_rank``: one entry per rank)."""
    groups, start = [], 0
    for group in optimizer.param_groups:
        count = len(group["params"])
        hyperparameters = {key: value for key, value in group.items() if key != "params"}
        groups.append({**hyperparameters, "params": list(range(start, start + count))})
        start += count
    return {"state": {}, "param_groups": groups, SHARDS_KEY: shards}


def own_chunks(sharding: ZeroSharding) -> dict[str, Any]:
    """This rank's share: per parameter index, the parameter's shape, where this rank's chunk starts in its flattened
    elements, and the optimizer state of that chunk."""
    state = sharding.optimizer.state
    chunks = {
        index: {"shape": list(slot.param.shape), "start": slot.start, "state": state[slot.shard]}
        for index, slot in sharding.state_slots()
        if slot.shard in state
    }
    return {_CHUNKS: chunks}


def whole_state_dict(state: dict[str, Any], only_rank: int | None = None) -> dict[str, Any]:
    """The state dict of an unsharded optimizer from a :func:`sharded_state_dict` (other state dicts are returned as
    they are). ``only_rank``: take that saving rank's share only, for shares of whole parameters (those written
    before ZeRO kept chunks; a ZeRO optimizer of the same world size needs no other)."""
    if SHARDS_KEY not in state:
        return state
    shards: Sequence[dict[Any, Any]] = state[SHARDS_KEY]
    whole = {key: value for key, value in state.items() if key != SHARDS_KEY}
    if len(shards) and _CHUNKS in shards[0]:
        return {**whole, "state": _merge_chunks([shard[_CHUNKS] for shard in shards])}
    merged: dict[int, Any] = {}
    for rank in range(len(shards)) if only_rank is None else [only_rank]:
        merged.update(shards[rank])
    return {**whole, "state": dict(sorted(merged.items()))}


def _merge_chunks(ranks: list[dict[int, Any]]) -> dict[int, Any]:
    merged: dict[int, Any] = {}
    for index in sorted({index for chunks in ranks for index in chunks}):
        parts = sorted((chunks[index] for chunks in ranks if index in chunks), key=lambda part: part["start"])
        shape = parts[0]["shape"]
        entry: dict[str, Any] = {}
        for name, value in parts[0]["state"].items():
            if isinstance(value, torch.Tensor) and value.dim() == 1:  # elementwise: one piece per rank
                entry[name] = torch.cat([part["state"][name] for part in parts]).view(shape)
            else:  # a step count or a setting, the same on every rank
                entry[name] = value
        merged[index] = entry
    return merged


def chunked_state_dict(state: dict[str, Any], sharding: ZeroSharding) -> dict[str, Any]:
    """The state dict of ``sharding``'s optimizer: this rank's chunk of each parameter's state in ``state`` (an
    unsharded optimizer's state dict, or a :func:`sharded_state_dict` of any world size)."""
    shards = state.get(SHARDS_KEY)
    if shards is not None and len(shards) == sharding.world_size and _CHUNKS in shards[0]:
        # the same world size: this rank's own file holds its chunks
        own = shards[sharding.rank][_CHUNKS]
        chunks = {index: own[index]["state"] for index in own}
        return {"state": chunks, "param_groups": state["param_groups"]}
    whole = whole_state_dict(state)
    cut: dict[int, Any] = {}
    for index, slot in sharding.state_slots():
        if index not in whole["state"]:
            continue
        cut[index] = {
            name: value.reshape(-1)[slot.start : slot.stop].clone()
            if isinstance(value, torch.Tensor) and value.shape == slot.param.shape and value.dim() > 0
            else value
            for name, value in whole["state"][index].items()
        }
    return {"state": cut, "param_groups": whole["param_groups"]}


def training_state_bytes(module: nn.Module, optimizers: Iterable[Optimizer]) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state, each storage counted once (a ZeRO
    optimizer's parameters are views of the model's; a DTensor counts its local shard)."""
    seen: set[int] = set()

    def held(tensors: Iterable[torch.Tensor]) -> int:
        total = 0
        for tensor in tensors:
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            storage = local.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                continue
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return total

    parameters = list(module.parameters())
    # torch's ZeroRedundancyOptimizer keeps this rank's state in the optimizer it wraps
    optimizers = [o.optim if isinstance(getattr(o, "optim", None), Optimizer) else o for o in optimizers]  # type: ignore[attr-defined]
    optimized = [p for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]]
    state = [v for o in optimizers for per in o.state.values() for v in per.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": held(parameters + optimized),
        "gradients": held(p.grad for p in parameters + optimized if p.grad is not None),
        "optimizer": held(state),
    }
