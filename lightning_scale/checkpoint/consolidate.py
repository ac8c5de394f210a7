"""One file from a sharded checkpoint (``ResumableCheckpoint(sharded=True)`` or Lightning's ``model_parallel``), for
single-device use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_scale.checkpoint.rank_local import materialize
from lightning_scale.checkpoint.sharded import is_sharded_checkpoint, load_sharded
from lightning_scale.parallel.data.zero_state import whole_state_dict

__all__ = ["consolidate_checkpoint"]


def consolidate_checkpoint(path: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the sharded checkpoint directory ``path`` as one file ``out``, and return it.

    ``state_dict`` holds the unsharded model weights under their usual names (``model.load_state_dict`` on one device
    loads them strictly). Optimizer states are as the strategy saved them: unchanged for DDP-like strategies, ZeRO-1's
    per-rank shares merged into one state dict, keyed by parameter name for ``model_parallel`` (as
    ``torch.distributed.checkpoint`` stores them). Loop position and callbacks are unchanged; what each rank wrote
    for itself (data position, RNG states) becomes a list, one entry per rank, as in a single-file checkpoint. Runs in
    one process, without a process group; ``meta.pt`` is loaded with ``weights_only=True``.

    Raises:
        ValueError: ``path`` is not a sharded checkpoint directory.
    """
    if not is_sharded_checkpoint(str(path)):
        raise ValueError(
            f"{path} is not a sharded checkpoint directory (it needs the shards' .metadata and meta.pt); pass a "
            "directory that ResumableCheckpoint(sharded=True) or a model_parallel run saved."
        )
    checkpoint = materialize(load_sharded(str(path), weights_only=True))
    checkpoint["optimizer_states"] = [whole_state_dict(state) for state in checkpoint.get("optimizer_states", [])]
    torch.save(checkpoint, out)
    return checkpoint
