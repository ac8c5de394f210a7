"""What the LightningModule gives the pipeline: the loss of one microbatch, and how to tell a batch's inputs from its
target, as the first and last stages need them. No Lightning here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from lightning_scale.errors import ConfigurationError

__all__ = ["inputs_and_target", "inputs_of", "loss_fn_of"]

SplitBatch = Callable[[Any], Any]  # the LightningModule's pipeline_split_batch(batch) -> (inputs, target)


def inputs_and_target(batch: Any, split: SplitBatch | None) -> tuple[tuple[Tensor, ...], Tensor]:
    """``(inputs as a tuple, target)`` by ``split`` or, without it, from a batch ``(inputs, target)``.

    Examples:
        >>> import torch
        >>> inputs, target = inputs_and_target([torch.zeros(2, 3), torch.ones(2)], None)
        >>> len(inputs), target.tolist()
        (1, [1.0, 1.0])
    """
    if split is not None:
        inputs, target = split(batch)
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        inputs, target = batch
    else:
        raise ConfigurationError(
            f"pipeline_parallel cannot tell inputs from target in a batch of type {type(batch).__name__}; define "
            "pipeline_split_batch(batch) -> (inputs, target) on the LightningModule."
        )
    return (inputs if isinstance(inputs, tuple) else (inputs,)), target


def inputs_of(batch: Any, split: SplitBatch | None) -> tuple[Tensor, ...]:
    """The inputs to predict from: by ``split``, else the first of a pair ``(inputs, target)``, else the batch."""
    if split is not None:
        inputs = split(batch)[0]
    else:
        inputs = batch[0] if isinstance(batch, (tuple, list)) and len(batch) == 2 else batch
    return inputs if isinstance(inputs, tuple) else (inputs,)


def loss_fn_of(module: Any) -> Callable[[Tensor, Tensor], Tensor]:
    """The module's ``pipeline_loss_fn(output, target)``; refused, with what it must be, when it has none."""
    loss_fn = getattr(module, "pipeline_loss_fn", None)
    if not callable(loss_fn):
        raise ConfigurationError(
            f"{type(module).__name__} needs pipeline_loss_fn(output, target) -> Tensor: the loss of one "
            "microbatch, computed on the last pipeline stage."
        )
    return loss_fn
