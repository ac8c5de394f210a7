"""The gradient stash: a step's gradients wait outside the parameters and come back scaled, added to earlier ones."""

from __future__ import annotations

import torch
from torch import nn

from lightning_scale.parallel.pipeline import GradientStash


def test_stashed_gradients_are_added_scaled_to_those_accumulated_before():
    layer, stash = nn.Linear(2, 1, bias=False), GradientStash()
    layer.weight.grad = torch.ones(1, 2)  # accumulated by an earlier batch
    with stash.collecting(list(layer.parameters())):
        assert layer.weight.grad is None  # out of this step's backward
        layer(torch.full((1, 2), 3.0)).sum().backward()
    assert torch.equal(layer.weight.grad, torch.ones(1, 2))  # what the loop zeroes or keeps in between
    stash.add_to(layer.parameters(), scale=0.5)
    assert torch.equal(layer.weight.grad, torch.full((1, 2), 2.5))


def test_a_parameter_without_a_gradient_takes_the_stashed_tensor_itself():
    layer, stash = nn.Linear(2, 1, bias=False), GradientStash()
    with stash.collecting(list(layer.parameters())):
        layer(torch.ones(1, 2)).sum().backward()
        stashed = layer.weight.grad
    stash.add_to(layer.parameters(), scale=1.0)
    assert layer.weight.grad is stashed
