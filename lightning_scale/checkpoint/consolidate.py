"""One file from a sharded (``torch.distributed.checkpoint``) Lightning checkpoint, for single-device use."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

__all__ = ["consolidate_checkpoint"]

METADATA_FILE = "meta.pt"  # Lightning's non-tensor part of a sharded checkpoint


def consolidate_checkpoint(path: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the sharded checkpoint directory ``path`` as one file ``out``, and return it.

    ``state_dict`` holds the unsharded model weights under their usual names (``model.load_state_dict`` on one device
    loads them strictly); ``optimizer_states`` are keyed by parameter name, as ``torch.distributed.checkpoint``
    stores them; everything else (loop position, callbacks, data state) is Lightning's metadata, unchanged. Runs in
    one process, without a process group.

    Raises:
        ValueError: ``path`` is not a sharded checkpoint directory.
    """
    path = Path(path)
    if not (path / ".metadata").is_file() or not (path / METADATA_FILE).is_file():
        raise ValueError(
            f"{path} is not a sharded checkpoint directory (it needs the shards' .metadata and Lightning's "
            f"{METADATA_FILE}); pass the directory a model_parallel run saved."
        )
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "flat.pt"
        dcp_to_torch_save(path, flat)
        shards = torch.load(flat, weights_only=True)
    checkpoint = torch.load(path / METADATA_FILE, weights_only=True)
    checkpoint["state_dict"] = shards["state_dict"]
    optimizers = sorted((k for k in shards if k.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    checkpoint["optimizer_states"] = [shards[k] for k in optimizers]
    torch.save(checkpoint, out)
    return checkpoint
