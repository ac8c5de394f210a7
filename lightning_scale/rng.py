"""Capture and restore the random number generators of one process.

Covers Python's ``random``, NumPy's legacy global generator (when NumPy is installed), torch's CPU generator and,
when CUDA is initialised, every CUDA device's generator. States are kept as bytes and plain numbers: a checkpoint
holding them loads with ``torch.load(weights_only=True)``, and DataLoader workers, which send theirs to the main
process after every batch, send a few kilobytes through the pipe instead of tensors through shared memory.
"""

from __future__ import annotations

import random
from typing import Any

import torch

try:  # NumPy is optional for users; torch works without it.
    import numpy as np
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    np = None  # type: ignore[assignment]  # every use checks `np is not None`

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The RNG states of this process, in a ``weights_only``-loadable form."""
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": internal, "gauss_next": gauss_next},
        "torch": torch.get_rng_state().numpy().tobytes(),
    }
    if np is not None:
        legacy = np.random.get_state(legacy=True)
        if not isinstance(legacy, tuple):  # a dict: np.random.set_bit_generator replaced MT19937
            raise ValueError(
                f"NumPy's global generator is {legacy.get('bit_generator')}, not MT19937, whose state is the one "
                "saved here; keep NumPy's default global generator (do not call np.random.set_bit_generator)."
            )
        kind, keys, pos, has_gauss, cached = legacy
        state["numpy"] = {
            "kind": kind,
            "keys": keys.tobytes(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put this process's generators back to ``state`` (as returned by :func:`capture_rng_state`; the tensor form
    that lightning-scale 0.1 wrote is read too)."""
    py = state["python"]
    internal = py["state"].tolist() if isinstance(py["state"], torch.Tensor) else py["state"]
    random.setstate((py["version"], tuple(internal), py["gauss_next"]))
    torch.set_rng_state(_tensor(state["torch"]))
    if np is not None and "numpy" in state:
        npy = state["numpy"]
        keys = npy["keys"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.frombuffer(keys, dtype=np.uint32)
        np.random.set_state((npy["kind"], keys.astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tensor(torch_state: bytes | torch.Tensor) -> torch.Tensor:
    if isinstance(torch_state, torch.Tensor):
        return torch_state
    return torch.frombuffer(bytearray(torch_state), dtype=torch.uint8)
