"""Memory snapshots: every rank's training state in node-local shared memory, a restart's fastest way back.

Plain logic, no Lightning: the layout of a snapshot (:mod:`~lightning_scale.snapshot.codec`), one rank's two slots
(:mod:`~lightning_scale.snapshot.slots`), what a node holds (:mod:`~lightning_scale.snapshot.node`), which snapshot a
restarted job resumes from (:mod:`~lightning_scale.snapshot.plan`) and how often to take one
(:mod:`~lightning_scale.snapshot.cadence`). ``ResumableCheckpoint`` takes them and resumes from them.
"""

from lightning_scale.snapshot.cadence import SnapshotCadence
from lightning_scale.snapshot.codec import Packed, UnsupportedTensorError, pack, unpack
from lightning_scale.snapshot.node import NodeSnapshots, free_bytes, job_directory
from lightning_scale.snapshot.plan import RestorePlan, plan_restore
from lightning_scale.snapshot.slots import SnapshotHeader, SnapshotSlots

__all__ = [
    "NodeSnapshots",
    "Packed",
    "RestorePlan",
    "SnapshotCadence",
    "SnapshotHeader",
    "SnapshotSlots",
    "UnsupportedTensorError",
    "free_bytes",
    "job_directory",
    "pack",
    "plan_restore",
    "unpack",
]
