"""RNG capture/restore covers Python, NumPy and torch, and survives a weights_only checkpoint load."""

from __future__ import annotations

import io
import random

import numpy as np
import torch

from lightning_scale.rng import capture_rng_state, restore_rng_state


def draw() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist(), random.gauss(0, 1)


def test_restore_replays_every_generator_after_a_weights_only_round_trip():
    random.gauss(0, 1)  # leave a cached gaussian in Python's state
    state = capture_rng_state()
    expected = draw()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restore_rng_state(torch.load(buffer, weights_only=True))
    assert draw() == expected


def test_states_differ_after_drawing():
    state = capture_rng_state()
    draw()
    assert capture_rng_state()["torch"] != state["torch"]


def test_the_tensor_form_of_earlier_checkpoints_is_still_restored():
    state = capture_rng_state()
    expected = draw()
    old = {
        "python": {**state["python"], "state": torch.tensor(state["python"]["state"], dtype=torch.int64)},
        "torch": torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8),
        "numpy": {
            **state["numpy"],
            "keys": torch.from_numpy(np.frombuffer(state["numpy"]["keys"], np.uint32).astype(np.int64)),
        },
    }
    restore_rng_state(old)
    assert draw() == expected
