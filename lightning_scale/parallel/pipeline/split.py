"""Splitting a stack of blocks into pipeline stages: balanced by parameter count, names kept. No Lightning here."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.pipeline.materialize import is_meta, materialize_

__all__ = ["StagePlan", "balanced_partition", "plan_stages", "split_module_", "stage_ranks"]

LOOPED = "looped"
V_SHAPE = "v"


def balanced_partition(sizes: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Split ``sizes`` into ``parts`` contiguous, non-empty ranges ``[start, stop)`` minimising the largest sum."""
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ConfigurationError(f"Cannot split {n} blocks into {parts} non-empty stages.")
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    inf = float("inf")
    # best[k][i]: the smallest possible largest stage when the first i blocks form k stages; cut[k][i]: its last cut
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds, stop = [], n
    for k in range(parts, 0, -1):
        start = cut[k][stop]
        bounds.append((start, stop))
        stop = start
    return bounds[::-1]


def stage_ranks(num_stages: int, pipeline_size: int, style: str) -> list[int]:
    """The pipeline rank that holds each stage: round robin (``looped``) or there and back (``v``)."""
    if style == V_SHAPE:
        return [s if s < pipeline_size else 2 * pipeline_size - 1 - s for s in range(num_stages)]
    return [s % pipeline_size for s in range(num_stages)]


@dataclass(frozen=True)
class StagePlan:
    """Which blocks form each stage, and which pipeline rank runs it."""

    names: list[str]  # the blocks' names in the stack, in order
    bounds: list[tuple[int, int]]  # per stage: [start, stop) into ``names``
    ranks: list[int]  # per stage: the pipeline rank that runs it

    def local_stages(self, pipeline_rank: int) -> list[int]:
        return [stage for stage, rank in enumerate(self.ranks) if rank == pipeline_rank]

    def stage_module(self, stack: nn.Module, stage: int) -> nn.Sequential:
        """The blocks of ``stage``, under their names in ``stack`` (so state dict keys stay those of the full model)."""
        start, stop = self.bounds[stage]
        blocks = dict(stack.named_children())
        return nn.Sequential(OrderedDict((name, blocks[name]) for name in self.names[start:stop]))

    def local_stack(self, stack: nn.Module, pipeline_rank: int) -> nn.Sequential:
        """All blocks this rank runs, under their original names; it replaces the stack on this rank."""
        blocks = dict(stack.named_children())
        names = [self.names[i] for stage in self.local_stages(pipeline_rank) for i in range(*self.bounds[stage])]
        return nn.Sequential(OrderedDict((name, blocks[name]) for name in sorted(names, key=self.names.index)))

    def describe(self, stack: nn.Module) -> str:
        """One line per stage: its rank, blocks and parameter count (Lightning's ModelSummary shows rank 0's only)."""
        blocks = dict(stack.named_children())
        lines = []
        for stage, ((start, stop), rank) in enumerate(zip(self.bounds, self.ranks, strict=True)):
            names = self.names[start:stop]
            count = sum(p.numel() for name in names for p in blocks[name].parameters())
            lines.append(
                f"  stage {stage} on pipeline rank {rank}: blocks {names[0]}..{names[-1]}, {count:,} parameters"
            )
        return "\n".join(lines)


def plan_stages(stack: nn.Module, num_stages: int, pipeline_size: int, style: str) -> StagePlan:
    """Plan ``num_stages`` stages of the ``nn.Sequential``/``nn.ModuleList`` ``stack``, balanced by parameter count.

    Raises ``ValueError`` naming the fix when the stack is not a stack or has fewer blocks than stages.
    """
    if not isinstance(stack, (nn.Sequential, nn.ModuleList)):
        raise ConfigurationError(
            f"pipeline_parallel splits an nn.Sequential or nn.ModuleList of blocks; got {type(stack).__name__}. Put "
            "the whole network, in order, into one such stack and name its attribute with "
            "PipelineParallelStrategy(module=...)."
        )
    names = [name for name, _ in stack.named_children()]
    if len(names) < num_stages:
        raise ConfigurationError(
            f"The stack has {len(names)} blocks, fewer than the {num_stages} stages (pipeline_size x stages_per_rank); "
            "use fewer stages or split the model into more blocks."
        )
    blocks = dict(stack.named_children())
    # a block without parameters (an activation) still costs time: count it as one parameter
    sizes = [max(1, sum(p.numel() for p in blocks[name].parameters())) for name in names]
    bounds = balanced_partition(sizes, num_stages)
    return StagePlan(names=names, bounds=bounds, ranks=stage_ranks(num_stages, pipeline_size, style))


def split_module_(
    module: nn.Module, attribute: str, plan: StagePlan, pipeline_rank: int, device: torch.device, seed: int
) -> dict[int, nn.Sequential]:
    """Keep only ``pipeline_rank``'s blocks in ``module.<attribute>`` (under their names), give those built on the meta
    device storage and initial values (block ``i`` from seed ``seed + i``), and return this rank's stages
    ``{stage index: module}``.

    Raises ``ValueError`` naming the fix when parts of ``module`` outside the stack are still on the meta device.
    """
    stack = getattr(module, attribute)
    stages = {stage: plan.stage_module(stack, stage) for stage in plan.local_stages(pipeline_rank)}
    local = plan.local_stack(stack, pipeline_rank)
    setattr(module, attribute, local)
    materialize_(((plan.names.index(name), block) for name, block in local.named_children()), device, seed)
    if is_meta(module):
        raise ConfigurationError(
            f"{type(module).__name__} has parts on the meta device outside {attribute!r}; build only the "
            "stack of blocks under Trainer.init_module(empty_init=True), or everything without it."
        )
    return stages
