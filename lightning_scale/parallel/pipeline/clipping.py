"""Gradient clipping by the norm of ALL stages' gradients: clipping each stage by its own norm would be wrong."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["clip_grad_norm_across_"]


def clip_grad_norm_across_(
    parameters: Iterable[torch.Tensor], max_norm: float, sum_across: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Scale the gradients so that the 2-norm over every stage's gradients is at most ``max_norm``; returns that norm.

    ``sum_across`` sums a scalar over the pipeline's ranks. The arithmetic follows ``torch.nn.utils.clip_grad_norm_``
    (per-tensor norms, then their norm; coefficient ``max_norm / (norm + 1e-6)`` clamped at 1), so one process and a
    pipeline clip alike.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    if grads:
        norms = torch.stack([torch.linalg.vector_norm(g.detach(), 2.0).float() for g in grads])
        squares = (norms * norms).sum()
    total = sum_across(squares).sqrt()
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        grad.detach().mul_(coefficient.to(grad.device, grad.dtype))
    return total
