"""Where a job's memory snapshots live on a node, what that node holds, and whether it has room.

A job's snapshots are in ``<root>/lightning-scale-<uid>/<key>/rank<r>/``, where ``root`` is node-local shared memory
(``/dev/shm``; ``LIGHTNING_SCALE_SNAPSHOT_DIR`` moves it) and ``key`` is derived from the checkpoint directory, the one
thing every attempt of a job shares. Every process of the node sees every rank directory there: its own ranks'
snapshots and the copies it keeps for ranks on other nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from lightning_scale import knobs
from lightning_scale.snapshot.slots import SnapshotHeader, SnapshotSlots

__all__ = ["NodeSnapshots", "free_bytes", "job_directory"]


def job_directory(checkpoint_dirpath: str, root: str | None = None) -> Path:
    """The directory of the snapshots of the job that checkpoints to ``checkpoint_dirpath``, on this node.

    Examples:
        >>> job_directory("s3://bucket/run", root="/dev/shm").parent.name.startswith("lightning-scale-")
        True
    """
    key = hashlib.sha256(checkpoint_dirpath.rstrip("/").encode()).hexdigest()[:16]
    return Path(root or knobs.SNAPSHOT_DIR) / f"lightning-scale-{os.getuid()}" / key


def free_bytes(directory: Path) -> int:
    """Bytes free in the file system of ``directory`` (or of its nearest existing parent)."""
    existing = Path(directory)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


class NodeSnapshots:
    """Every rank's snapshot slots of one job on this node.

    Args:
        directory: The job's directory (:func:`job_directory`).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._slots: dict[int, SnapshotSlots] = {}

    def slots(self, rank: int) -> SnapshotSlots:
        """The slots of rank ``rank``'s state on this node."""
        if rank not in self._slots:
            self._slots[rank] = SnapshotSlots(self.directory / f"rank{rank}")
        return self._slots[rank]

    def ranks(self) -> list[int]:
        """The ranks whose slots exist on this node."""
        if not self.directory.is_dir():
            return []
        names = (path.name for path in self.directory.iterdir() if path.is_dir())
        return sorted(int(name[4:]) for name in names if name.startswith("rank") and name[4:].isdigit())

    def inventory(self) -> list[SnapshotHeader]:
        """The header of every valid snapshot on this node."""
        return [header for rank in self.ranks() for _, header in self.slots(rank).headers()]

    def find(self, rank: int, key: tuple[int, int], run_id: str) -> int | None:
        """The slot of rank ``rank``'s snapshot ``key`` of run ``run_id`` on this node, if there is one."""
        for slot, header in self.slots(rank).headers():
            if header.key == key and header.run_id == run_id:
                return slot
        return None

    def close(self) -> None:
        """Unmap every buffer this process mapped; safe to call twice."""
        for slots in self._slots.values():
            slots.close()

    def clear(self) -> None:
        """Remove the job's snapshots from this node (every rank's) and its directory."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        with contextlib.suppress(OSError):  # another job's snapshots are there, or another process removed it first
            self.directory.parent.rmdir()
