"""Keeping a pipeline step's gradients apart until the training loop's backward: the schedule runs backward inside the
step, before the loop zeroes the gradients. No Lightning here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from torch import Tensor, nn

__all__ = ["GradientStash"]


class GradientStash:
    """Holds one step's gradients outside the parameters, then adds them in when the loop's backward would have.

    Examples:
        >>> import torch
        >>> layer, stash = nn.Linear(2, 1), GradientStash()
        >>> with stash.collecting(list(layer.parameters())):
        ...     layer(torch.ones(1, 2)).sum().backward()
        >>> layer.weight.grad is None  # set aside, not lost
        True
        >>> stash.add_to(layer.parameters(), scale=1.0)
        >>> layer.weight.grad.tolist()
        [[1.0, 1.0]]
    """

    def __init__(self) -> None:
        self._pending: list[Tensor | None] | None = None

    @contextmanager
    def collecting(self, params: list[nn.Parameter]) -> Iterator[None]:
        """Stash the gradients the body computes into ``params``; the gradients accumulated before it stay in place
        (and out of the body's backward)."""
        earlier = [p.grad for p in params]
        for p in params:
            p.grad = None
        yield
        self._pending = [p.grad for p in params]
        for p, grad in zip(params, earlier, strict=True):
            p.grad = grad

    def add_to(self, params: Iterable[nn.Parameter], scale: float) -> None:
        """Add the stashed gradients, times ``scale``, to ``params`` (the same parameters, in the same order), and
        forget them. A parameter without a gradient takes the stashed tensor itself, not a copy."""
        for p, grad in zip(params, self._pending or [], strict=True):
            if grad is None:
                continue
            if p.grad is None:
                p.grad = grad if scale == 1.0 else grad.mul_(scale)
            else:
                p.grad.add_(grad, alpha=scale)
        self._pending = None
