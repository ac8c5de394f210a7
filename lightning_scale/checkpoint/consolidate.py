"""One file from a sharded checkpoint (``ResumableCheckpoint(sharded=True)`` or Lightning's ``model_parallel``), for
single-device use."""

from __future__ import annotations

import dataclasses
import errno
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from lightning_scale.checkpoint.manifest import manifest_name, read_manifest, validate
from lightning_scale.checkpoint.rank_local import materialize
from lightning_scale.checkpoint.sharded import is_sharded_checkpoint, load_sharded
from lightning_scale.checkpoint.store import CheckpointStore
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

    A checkpoint with a manifest beside it (``ResumableCheckpoint``'s) must match it, file by file, as for
    auto-resume; one without (Lightning's own) is read as it is. ``out`` must not exist: it is written under a
    temporary name beside it and linked into place, so a failure leaves no partial file and no file is replaced.

    ``path`` is a local path or an fsspec URL; ``out`` a local path.

    Raises:
        ValueError: ``path`` is not a sharded checkpoint directory, or does not match its manifest.
        FileExistsError: ``out`` exists.
        FileNotFoundError: ``out``'s directory does not exist.
    """
    path, out = str(path).rstrip("/"), Path(out)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists: consolidate never replaces a file; pass a new path for OUT.")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"{out.parent} is not a directory: create it first, or pass OUT in an existing one.")
    if not is_sharded_checkpoint(path):
        raise ValueError(
            f"{path} is not a sharded checkpoint directory (it needs the shards' .metadata and meta.pt); pass a "
            "directory that ResumableCheckpoint(sharded=True) or a model_parallel run saved."
        )
    damage = _damage(path)
    if damage is not None:
        raise ValueError(f"{path} is damaged ({damage}); auto-resume skips it too: consolidate an intact checkpoint.")
    checkpoint = materialize(load_sharded(path, weights_only=True))
    checkpoint["optimizer_states"] = [whole_state_dict(state) for state in checkpoint.get("optimizer_states", [])]
    partial = out.with_name(f".{out.name}.{uuid.uuid4().hex}.partial")
    try:
        torch.save(checkpoint, partial)
        _publish(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return checkpoint


def _publish(partial: Path, out: Path) -> None:
    """``partial`` under the name ``out``, which must not exist."""
    try:
        os.link(partial, out)  # unlike a rename, fails if OUT appeared meanwhile
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV) or out.exists():
            raise
        os.rename(partial, out)  # a filesystem without hard links: checked just before


def _damage(path: str) -> str | None:
    """How ``path`` differs from its manifest (``None``: intact, or no manifest to check against)."""
    parent, _, name = path.rpartition("/")
    store = CheckpointStore(parent or ("/" if path.startswith("/") else "."))
    if not store.exists(manifest_name(name)):
        return None
    try:
        manifest = read_manifest(store, name)
    except (OSError, ValueError, TypeError, KeyError) as err:
        return f"its manifest cannot be read: {type(err).__name__}: {err}"
    return validate(store, dataclasses.replace(manifest, name=name))
