"""Tunables of lightning-scale in one place; each reads an environment variable so tests can override it."""

from __future__ import annotations

import os

__all__ = ["COLLECTIVE_TIMEOUT_S", "HASH_CHUNK_BYTES", "LOADER_STATE_HISTORY"]


def _int(name: str, default: int) -> int:
    return int(os.environ.get(f"LIGHTNING_SCALE_{name}", default))


HASH_CHUNK_BYTES = _int("HASH_CHUNK_BYTES", 8 * 1024 * 1024)
"""Bytes read at a time when hashing a checkpoint file."""

LOADER_STATE_HISTORY = _int("LOADER_STATE_HISTORY", 4)
"""Per-batch loader states kept for loaders that Lightning fetches ahead of (must exceed its prefetch depth)."""

COLLECTIVE_TIMEOUT_S = _int("COLLECTIVE_TIMEOUT_S", 120)
"""Process-group timeout of the jobs that ``assert_exact_resume`` runs: a hang fails with a traceback."""
