"""A checkpoint taken apart into tensor bytes and a skeleton comes back equal, whatever Lightning puts in it."""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest
import torch

from lightning_scale.snapshot.codec import (
    ALIGNMENT,
    UnsupportedTensorError,
    pack,
    tensors_from_buffer,
    unpack,
)


def _round_trip(obj):
    packed = pack(obj)
    buffer = torch.zeros(packed.nbytes, dtype=torch.uint8)
    packed.copy_into(buffer)
    return packed, unpack(packed.skeleton, packed.refs, tensors_from_buffer(packed.refs, buffer))


def test_a_lightning_like_checkpoint_comes_back_bitwise_with_its_container_types():
    weight = torch.randn(4, 3)
    state = {
        "state_dict": collections.OrderedDict(w=weight, b=torch.zeros(3, dtype=torch.bfloat16), n=torch.tensor(7)),
        "optimizer_states": [{"state": {0: {"exp_avg": weight.t()}}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        "flags": torch.tensor([True, False]),
        "empty": torch.empty(0, 5),
        "epoch": 3,
    }
    packed, back = _round_trip(state)
    assert type(back["state_dict"]) is collections.OrderedDict
    for name, tensor in state["state_dict"].items():
        assert back["state_dict"][name].dtype == tensor.dtype and torch.equal(back["state_dict"][name], tensor)
    assert torch.equal(back["optimizer_states"][0]["state"][0]["exp_avg"], weight.t())  # non-contiguous source
    assert back["optimizer_states"][0]["param_groups"] == state["optimizer_states"][0]["param_groups"]
    assert torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    assert back["rng"]["python"] == state["rng"]["python"]
    assert np.array_equal(back["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert back["flags"].tolist() == [True, False] and back["empty"].shape == (0, 5) and back["epoch"] == 3
    assert all(ref.offset % ALIGNMENT == 0 for ref in packed.refs)


def test_a_tensor_referred_to_twice_is_stored_once_and_each_restored_tensor_owns_its_storage():
    shared = torch.arange(6.0)
    packed, back = _round_trip({"a": shared, "b": shared, "c": torch.ones(2)})
    assert len(packed.refs) == 2
    assert back["a"] is back["b"]
    assert back["c"].storage_offset() == 0 and back["a"].storage_offset() == 0
    generator = torch.Generator()
    packed, back = _round_trip({"gen": generator.get_state(), "pad": torch.ones(3)})
    torch.Generator().set_state(back["gen"])  # crashes on a view into a larger storage


def test_requires_grad_survives_and_a_sparse_tensor_is_refused():
    _, back = _round_trip({"p": torch.nn.Parameter(torch.ones(2))})
    assert back["p"].requires_grad
    with pytest.raises(UnsupportedTensorError, match="sparse"):
        pack({"s": torch.ones(2, 2).to_sparse()})


def test_copy_into_refuses_a_buffer_that_is_too_small():
    packed = pack({"w": torch.ones(100)})
    with pytest.raises(ValueError, match="at least 400 bytes"):
        packed.copy_into(torch.empty(10, dtype=torch.uint8))
