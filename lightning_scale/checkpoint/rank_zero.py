"""Checkpoint storage work done by rank 0 (or every rank) whose failure every rank raises alike, so that no rank
waits in a collective for one that gave up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_scale import distributed
from lightning_scale.checkpoint.store import CheckpointStorageError, UnusableStorageError
from lightning_scale.errors import UsageError

__all__ = ["on_storage"]

T = TypeVar("T")


def on_storage(fn: Callable[[], T], what: str, dirpath: str, every_rank: bool = False) -> T:
    """Run ``fn`` on rank 0 (or every rank) and return its result on every rank; if it fails anywhere, every rank
    raises ``CheckpointStorageError`` (``UnusableStorageError`` for a usage error such as a read-only directory)
    naming ``what`` and ``dirpath``."""
    try:
        return distributed.on_every_rank(fn) if every_rank else distributed.on_rank_zero(fn)
    except distributed.RankFailedError as err:
        if isinstance(err.__cause__, CheckpointStorageError):
            raise err.__cause__ from err
        raise (UnusableStorageError if isinstance(err, UsageError) else CheckpointStorageError)(
            f"{what} failed ({err}) in {dirpath}. Earlier checkpoints are untouched; check the storage (space, "
            "permissions, credentials) and re-run to resume."
        ) from err
