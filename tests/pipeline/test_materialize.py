"""Meta-device blocks get storage and layout-independent initial values on the rank that runs them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_scale.parallel.pipeline import is_meta, materialize_


def blocks() -> list[nn.Module]:
    return [nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), nn.Linear(4, 2), nn.Tanh()]


def test_each_block_gets_the_same_weights_whichever_blocks_are_materialised_together():
    with torch.device("meta"):
        every, only_second = blocks(), blocks()
    materialize_(enumerate(every), torch.device("cpu"), seed=7)
    materialize_([(1, only_second[1])], torch.device("cpu"), seed=7)
    assert not is_meta(every[0]) and not is_meta(every[1])
    assert torch.equal(every[1].weight, only_second[1].weight)
    assert is_meta(only_second[0])  # a block this rank does not run is never allocated
    assert not torch.equal(every[0][0].weight[:2], every[1].weight)  # each block its own seed
    assert torch.equal(every[0][1].weight, torch.ones(4))  # LayerNorm's own reset_parameters


def test_the_global_rng_is_left_as_it_was_and_real_blocks_are_untouched():
    real = nn.Linear(3, 3)
    before = real.weight.clone()
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    with torch.device("meta"):
        meta = nn.Linear(3, 3)
    materialize_([(0, real), (1, meta)], torch.device("cpu"), seed=0)
    assert torch.equal(torch.rand(2), expected)
    assert torch.equal(real.weight, before)


def test_a_parameter_without_reset_parameters_is_refused_with_the_fix():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(2))

    with torch.device("meta"):
        block = nn.Sequential(nn.Linear(2, 2), Scale())
    with pytest.raises(ValueError, match=r"Scale \(1\).*reset_parameters\(\).*empty_init=True"):
        materialize_([(0, block)], torch.device("cpu"), seed=0)
