"""Tunables of lightning-scale in one place; each reads an environment variable so tests can override it."""

from __future__ import annotations

import os

__all__ = [
    "COLLECTIVE_TIMEOUT_S",
    "HASH_CHUNK_BYTES",
    "HTTP_TIMEOUT_S",
    "LOADER_STATE_HISTORY",
    "PREEMPTION_SAVE_MARGIN",
    "PROGRESS_EVERY_S",
    "SNAPSHOT_DIR",
    "STORAGE_ATTEMPTS",
    "STORAGE_BACKOFF_S",
    "STORAGE_CALL_TIMEOUT_S",
    "STORAGE_MIN_UPLOAD_BYTES_PER_S",
    "UPLOAD_CONCURRENCY",
    "UPLOAD_PART_BYTES",
    "WARM_PEER_TIMEOUT_S",
    "WARM_POLL_S",
    "WARM_READY_TIMEOUT_S",
    "WARM_RESTARTS",
    "WORKER_START_TIMEOUT_S",
]


def _int(name: str, default: int) -> int:
    return int(os.environ.get(f"LIGHTNING_SCALE_{name}", default))


def _float(name: str, default: float) -> float:
    return float(os.environ.get(f"LIGHTNING_SCALE_{name}", default))


def _str(name: str, default: str) -> str:
    return os.environ.get(f"LIGHTNING_SCALE_{name}", default)


HASH_CHUNK_BYTES = _int("HASH_CHUNK_BYTES", 8 * 1024 * 1024)
"""Bytes read at a time when hashing a checkpoint file."""

LOADER_STATE_HISTORY = _int("LOADER_STATE_HISTORY", 4)
"""Per-batch loader states kept for loaders that Lightning fetches ahead of (must exceed its prefetch depth)."""

COLLECTIVE_TIMEOUT_S = _int("COLLECTIVE_TIMEOUT_S", 120)
"""Process-group timeout of the jobs that ``assert_exact_resume`` runs: a hang fails with a traceback."""

PREEMPTION_SAVE_MARGIN = _float("PREEMPTION_SAVE_MARGIN", 1.5)
"""On a notice, save only when the time left exceeds this multiple of the last measured save time."""

HTTP_TIMEOUT_S = _float("HTTP_TIMEOUT_S", 2.0)
"""Timeout of one request to a cloud metadata service."""

STORAGE_ATTEMPTS = _int("STORAGE_ATTEMPTS", 4)
"""Attempts of one checkpoint upload or rename while it fails transiently (connection lost, timeout)."""

STORAGE_BACKOFF_S = _float("STORAGE_BACKOFF_S", 2.0)
"""Wait before the second attempt; each further wait doubles (2, 4, 8 s by default)."""

STORAGE_CALL_TIMEOUT_S = _float("STORAGE_CALL_TIMEOUT_S", 120.0)
"""Deadline of one call to an asynchronous object store (s3fs, gcsfs, adlfs); an upload gets this plus its size at
:data:`STORAGE_MIN_UPLOAD_BYTES_PER_S`. A call past its deadline is cancelled and counts as a transient failure
(retried): a connection that goes silent mid-upload otherwise hangs the save, since HTTP clients time out reads and
connects but not a blocked send."""

STORAGE_MIN_UPLOAD_BYTES_PER_S = _float("STORAGE_MIN_UPLOAD_BYTES_PER_S", 8 * 1024 * 1024)
"""The slowest upload rate that :data:`STORAGE_CALL_TIMEOUT_S` allows for (a 10 GB upload may take 21 min)."""

UPLOAD_PART_BYTES = _int("UPLOAD_PART_BYTES", 64 * 1024 * 1024)
"""Part size of multipart uploads to object stores that take one (s3fs): a checkpoint of at least two parts is sent
as parts, concurrently, and a failed part is re-sent alone."""

UPLOAD_CONCURRENCY = _int("UPLOAD_CONCURRENCY", 2)
"""Parts of one upload in flight at once (s3fs): an upload holds about this many parts in memory (s3fs's own default,
10 parts of 64 MiB, held a 252 MB shard twice over on every rank)."""

PROGRESS_EVERY_S = _float("PROGRESS_EVERY_S", 10.0)
"""Shortest time between two writes of the progress marker that tells a restarted job how many steps it lost."""

WORKER_START_TIMEOUT_S = _float("WORKER_START_TIMEOUT_S", 600.0)
"""Default bound for a training loader's workers to deliver the first batch of an epoch before the rank reports them
stuck and exits (``DataStateCheckpoint(worker_start_timeout_s=...)``)."""

SNAPSHOT_DIR = _str("SNAPSHOT_DIR", "/dev/shm")
"""Node-local shared memory where ``ResumableCheckpoint`` keeps its memory snapshots (a tmpfs; each node its own)."""

WARM_RESTARTS = _int("WARM_RESTARTS", 3)
"""Under torchrun, how many times the ``lightning-scale`` command restarts a failed training from each rank's warm
parent before it leaves the failure to torchrun (0: every failure goes to torchrun, as without warm restarts)."""

WARM_POLL_S = _float("WARM_POLL_S", 0.05)
"""How often a warm-restart parent looks at its training process and at its peers' news."""

WARM_PEER_TIMEOUT_S = _float("WARM_PEER_TIMEOUT_S", 2.0)
"""A warm-restart parent whose heartbeat stood still this long is gone (its node was lost)."""

WARM_READY_TIMEOUT_S = _float("WARM_READY_TIMEOUT_S", 30.0)
"""The longest that warm-restart parents wait for each other before a restart (then torchrun restarts the job)."""
