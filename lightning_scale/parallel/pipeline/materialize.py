"""Giving real storage and initial values to blocks built on the meta device. No Lightning here."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from lightning_scale._torch_internals import parameter_initialiser
from lightning_scale.errors import ConfigurationError

__all__ = ["is_meta", "materialize_"]


def is_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` lives on the meta device (has no storage yet)."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def _reset(module: nn.Module) -> None:
    for sub_name, sub in module.named_modules():
        owns = [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]
        if not owns:
            continue
        reset = parameter_initialiser(sub)
        if reset is None:
            raise ConfigurationError(
                f"{type(sub).__name__} ({sub_name or 'the block itself'}) was built on the meta device but has no "
                "reset_parameters() to initialise it on its pipeline rank; give it one, or build the model without "
                "Trainer.init_module(empty_init=True)."
            )
        reset()


def materialize_(blocks: Iterable[tuple[int, nn.Module]], device: torch.device, seed: int) -> None:
    """Allocate each meta ``(index, block)`` on ``device`` and initialise it with its modules' ``reset_parameters()``.

    Block ``index`` draws its values from seed ``seed + index``, so a block gets the same weights whichever rank
    materialises it (the result does not depend on the pipeline layout). The global RNG is left as it was.
    Blocks already holding storage are left alone.
    """
    with torch.random.fork_rng(devices=[]):
        for index, block in blocks:
            if not is_meta(block):
                continue
            block.to_empty(device=device)
            torch.manual_seed(seed + index)
            with torch.no_grad():
                _reset(block)
