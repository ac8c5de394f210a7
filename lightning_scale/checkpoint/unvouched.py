"""Checkpoints without a manifest, as Lightning's stock ``ModelCheckpoint`` writes them: which one a run switching to
``ResumableCheckpoint`` can resume from.

Nothing vouches for such a file (the stock writer may leave it truncated), so its content is checked instead: it must be
a ``torch.save`` archive whose every entry passes its CRC check, holding a training checkpoint (loop and optimizer
states), not weights only. That reads the whole file once, and is done only when no checkpoint with a manifest exists.
"""

from __future__ import annotations

import zipfile

from lightning_scale.checkpoint.manifest import MANIFEST_SUFFIX, manifest_name
from lightning_scale.checkpoint.store import CheckpointStore

__all__ = ["find_newest_unvouched", "unvouched_problem"]

TRAINING_KEYS = (b"loops", b"optimizer_states")
"""Keys of a Lightning training checkpoint, which its pickle holds as plain strings (weights-only files lack them)."""


def find_newest_unvouched(store: CheckpointStore) -> tuple[str | None, list[str]]:
    """The newest ``.ckpt`` file in ``store`` without a manifest that can resume training (by modification time), and
    one line for each newer one that cannot."""
    names = store.names()
    candidates = [n for n in names if n.endswith(".ckpt") and manifest_name(n) not in names]
    candidates.sort(key=store.modified_unix, reverse=True)
    skipped: list[str] = []
    for name in candidates:
        problem = unvouched_problem(store, name)
        if problem is None:
            return name, skipped
        skipped.append(f"{store.url(name)}: {problem}")
    return None, skipped


def unvouched_problem(store: CheckpointStore, name: str) -> str | None:
    """Why the file ``name`` cannot resume a run (``None``: it is a complete Lightning training checkpoint)."""
    if name.endswith(MANIFEST_SUFFIX):
        return "a manifest, not a checkpoint"
    try:
        with store.open(name) as handle, zipfile.ZipFile(handle) as archive:
            broken = archive.testzip()
            if broken is not None:
                return f"its entry {broken} fails the CRC check (a damaged file)"
            pickles = [entry for entry in archive.namelist() if entry.endswith("/data.pkl")]
            pickled = archive.read(pickles[0]) if pickles else b""
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        return f"not a complete torch.save archive ({type(err).__name__}: {err})"
    if not pickles:
        return "not a torch.save archive"
    if not all(key in pickled for key in TRAINING_KEYS):
        return "it holds weights only (save_weights_only=True), which cannot resume training"
    return None
