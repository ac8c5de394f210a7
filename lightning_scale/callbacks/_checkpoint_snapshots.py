"""Memory snapshots, the Lightning glue: ``ResumableCheckpoint`` takes one on the steps its cadence picks, and a
restarted job resumes from the newest one every rank can load when it is at least as new as the durable checkpoint.

A snapshot is what a durable checkpoint holds (Lightning's checkpoint of the Trainer, every rank's data position and
RNG state included), each rank keeping its own values (:func:`~lightning_scale.checkpoint.rank_local.rank_local_values`:
no collective), copied into this node's shared memory (:mod:`lightning_scale.snapshot`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT

from lightning_scale import distributed
from lightning_scale._lightning_internals import dump_checkpoint
from lightning_scale._process_local import ProcessLocal
from lightning_scale.callbacks._checkpoint_io import ShardedAwareCheckpointIO
from lightning_scale.callbacks._checkpoint_lineage import RunLineage
from lightning_scale.callbacks._step_vote import StepVote
from lightning_scale.callbacks.hang_watchdog import HangWatchdog
from lightning_scale.checkpoint.rank_local import put_rank_local, rank_local_values, take_rank_local
from lightning_scale.checkpoint.resume import tensor_shapes
from lightning_scale.errors import ConfigurationError
from lightning_scale.snapshot import (
    NodeSnapshots,
    RestorePlan,
    SnapshotCadence,
    SnapshotHeader,
    UnsupportedTensorError,
    free_bytes,
    job_directory,
    pack,
    plan_restore,
    unpack,
)
from lightning_scale.snapshot.codec import tensors_from_buffer
from lightning_scale.snapshot.peer import PeerCopies
from lightning_scale.snapshot.slots import SLOTS, decode_meta, encode_meta, slot_bytes
from lightning_scale.strategies.data_parallel import DataParallelStrategy
from lightning_scale.strategies.pipeline_parallel import PipelineParallelStrategy

__all__ = ["MemoryResume", "MemorySnapshots", "holds_rank_specific_state", "memory_snapshots"]


@dataclass(frozen=True)
class MemoryResume:
    """A resume from memory: the path Lightning is given (the snapshot's meta file, or a description for one
    received from another node) and the snapshot's header."""

    path: str
    header: SnapshotHeader
    received_from: int | None


class MemorySnapshots(ProcessLocal):
    """Takes this rank's snapshots and resumes from them.

    Args:
        cadence: How many steps apart snapshots are (a fixed number needs no collective to decide).
        lineage: The run's identity (its id and generation are recorded in each snapshot).
        clock: Monotonic seconds.
    """

    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {"_node": None, "_io": None, "_peers": None}

    def __init__(
        self, cadence: SnapshotCadence, lineage: RunLineage, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cadence = cadence
        self.lineage = lineage
        self.clock = clock
        self.last_seconds: float | None = None
        """Time training waited for the latest snapshot."""
        self._node: NodeSnapshots | None = None
        self._io: ShardedAwareCheckpointIO | None = None
        self._peers: PeerCopies | None = None
        self._portable = False
        self._warned = False
        self._room_checked = False
        self._since = 0
        self._step_seen = -1
        self._last_step_end: float | None = None
        self._copy_steps = 0  # steps so far beside the copy to another node in flight
        self._copy_beside = False  # whether a copy was in flight when the step now running began
        self._copies_sent = 0

    def setup(self, trainer: pl.Trainer, dirpath: str) -> None:
        """Snapshot this fit: under DDP (``ddp``, ``data_parallel``) and on one device, where each rank's checkpoint
        is its own state as it is (``model_parallel`` and ``pipeline_parallel`` are not covered)."""
        io, strategy = trainer.strategy.checkpoint_io, trainer.strategy
        supported = isinstance(strategy, DDPStrategy | SingleDeviceStrategy)
        supported = supported and not isinstance(strategy, PipelineParallelStrategy)
        if not supported or not isinstance(io, ShardedAwareCheckpointIO):
            return
        self._io, self._node = io, NodeSnapshots(job_directory(dirpath))
        self._portable = not holds_rank_specific_state(strategy)
        self._room_checked, self._since, self._step_seen, self._last_step_end = False, 0, -1, None
        self._copy_steps, self._copy_beside, self._copies_sent = 0, False, 0
        self._warned = False
        if PeerCopies.needed(trainer.world_size, trainer.num_devices):  # each snapshot also on the next node
            group = distributed.new_group("gloo")
            self._peers = PeerCopies(self._node, trainer.global_rank, trainer.world_size, trainer.num_devices, group)
        if self.cadence.every_n_steps is None:
            StepVote.of(trainer).join(self, self._ballot, deferred=True)

    def close(self, trainer: pl.Trainer) -> None:
        """Unmap this rank's buffers (the snapshots stay for a restart); safe to call twice."""
        StepVote.of(trainer).leave(self)
        if self._node is not None:
            self._node.close()

    def finish(self, trainer: pl.Trainer) -> None:
        """Training finished: remove the job's snapshots from every node (call on every rank)."""
        if self._node is None:
            return
        if self._peers is not None:
            self._peers.stop()
            distributed.destroy_group(self._peers.group)
            self._peers = None
        self._node.close()
        distributed.barrier()  # every rank is done with its slots
        if trainer.local_rank == 0:
            self._node.clear()
        self._node = None

    def discard(self) -> None:
        """Forget this node's snapshots (the state trained from was replaced, e.g. by a rollback)."""
        if self._node is not None:
            for rank in self._node.ranks():
                self._node.slots(rank).discard(lambda header: False)

    def on_train_batch_end(self, trainer: pl.Trainer, outputs: STEP_OUTPUT, batch_idx: int) -> None:
        """After an optimizer step, take a snapshot when it is due (never in the middle of gradient accumulation)."""
        if self._node is None or trainer.global_step == self._step_seen:
            return
        self._time_step(self.clock())
        self._since += 1
        if self.cadence.every_n_steps is not None:
            due = trainer.global_step % self.cadence.every_n_steps == 0
        else:
            due = StepVote.of(trainer).agreed(self, trainer, outputs, batch_idx)
        self._step_seen = trainer.global_step
        if due:
            with HangWatchdog.excluding(trainer, f"taking a memory snapshot of step {trainer.global_step}"):
                self._take(trainer)
        self._last_step_end = self.clock()
        self._copy_beside = self._peers is not None and self._peers.busy()

    def _time_step(self, now: float) -> None:
        """Give the cadence the step that just ended: with or without a copy to another node beside it (one in flight
        when the step began). Steps beside the first copies, which may allocate the other node's memory, are left
        out, as snapshots that allocate are."""
        measured = self._copies_sent > SLOTS
        if self._last_step_end is not None and (measured or not self._copy_beside):
            self.cadence.record_step(now - self._last_step_end, self._copy_beside)
        if self._copy_beside:
            self._copy_steps += 1
        elif self._copy_steps:  # the copy ended in the step before
            self._copy_ended()

    def _copy_ended(self) -> None:
        if self._copies_sent > SLOTS:
            self.cadence.record_copy(self._copy_steps)
        self._copy_steps = 0

    def _ballot(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> bool | None:
        if trainer.global_step == self._step_seen:
            return None  # no optimizer step in this batch
        return self._since + 1 >= self.cadence.steps()

    def _take(self, trainer: pl.Trainer) -> None:
        assert self._node is not None
        started = self.clock()
        slots = self._node.slots(distributed.rank())
        if self._peers is not None:
            self._peers.wait()  # the slot written now may be the one still being sent
            if self._copy_steps:  # it ran beside every step since the previous snapshot
                self._copy_ended()
        slot = slots.begin()  # a process that dies from here until the commit leaves the other slot as the newest
        with rank_local_values():
            checkpoint = dump_checkpoint(trainer, weights_only=False)
        checkpoint, mine = take_rank_local(checkpoint)
        if not self._room_checked:  # the first snapshot of the fit, on every rank: can every node hold them?
            self._room_checked = True
            packed, reason = None, None
            try:
                packed = pack({"checkpoint": checkpoint, "rank_local": mine})
            except UnsupportedTensorError as err:
                reason = f"its training state holds {err}"
            else:
                reason = self._no_room(packed.nbytes, trainer.num_devices)
            if distributed.any_rank(reason is not None) or packed is None:
                self._turn_off(trainer, reason or "another node cannot hold them")
                return
        else:
            packed = pack({"checkpoint": checkpoint, "rank_local": mine})
        header = SnapshotHeader(
            rank=distributed.rank(),
            world_size=distributed.world_size(),
            step=trainer.global_step,
            epoch=trainer.current_epoch,
            generation=self.lineage.generation,
            run_id=str(self.lineage.run_id),
            nbytes=packed.nbytes,
            created_unix=time.time(),
            tensor_shapes=tensor_shapes(checkpoint["state_dict"]),
            portable=self._portable,
        )
        mapped = slots.mapped_bytes(slot)
        try:
            buffer = slots.buffer(slot, packed.nbytes)
            packed.copy_into(buffer)
            meta = encode_meta(header, packed.skeleton, packed.refs)
            slots.write_meta(slot, meta)
        except OSError as err:  # shared memory filled up since: this rank goes on without this snapshot
            self._failed(err)
            return
        if self._peers is not None:
            self._peers.send(meta, buffer[: packed.nbytes])
            self._copies_sent += 1
        self.last_seconds = self.clock() - started
        if mapped >= packed.nbytes:  # a snapshot that first had to allocate its memory is not a measure
            self.cadence.record_snapshot(self.last_seconds)
        self._since = 0

    def _failed(self, err: OSError) -> None:
        """A snapshot that could not be written leaves its slot empty (a restart skips that step); said once."""
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"ResumableCheckpoint: a memory snapshot of rank {distributed.rank()} could not be written ({err}); "
                "training goes on, and a restart resumes from the newest snapshot every rank has, or from the durable "
                "checkpoints. Give the node more shared memory (LIGHTNING_SCALE_SNAPSHOT_DIR, --shm-size).",
                stacklevel=2,
            )

    def _no_room(self, nbytes: int, local_ranks: int) -> str | None:
        """Why this node cannot hold two snapshots of ``nbytes`` for each of ``local_ranks`` (``None``: it can)."""
        assert self._node is not None
        needed = SLOTS * slot_bytes(nbytes) * local_ranks * (2 if self._peers is not None else 1)  # and copies kept
        free = free_bytes(self._node.directory)
        if needed <= free:
            return None
        return (
            f"{SLOTS} snapshots of {nbytes / 2**20:.0f} MiB for each of the {local_ranks} processes of this node "
            f"{'and for those of another node ' if self._peers is not None else ''}"
            f"need {needed / 2**20:.0f} MiB, and {self._node.directory.parent.parent} has {free / 2**20:.0f} MiB "
            "free"
        )

    def _turn_off(self, trainer: pl.Trainer, reason: str) -> None:
        rank_zero_warn(
            f"ResumableCheckpoint: memory snapshots are off for this run: {reason}. A restart resumes from the "
            "durable checkpoints only. Give the node more shared memory (e.g. docker run --shm-size=8g), point "
            "LIGHTNING_SCALE_SNAPSHOT_DIR at a larger tmpfs, or pass snapshot_every_n_steps=None to silence this."
        )
        self.close(trainer)
        if self._peers is not None:  # every rank turns them off at the same snapshot
            self._peers.stop()
            distributed.destroy_group(self._peers.group)
            self._peers = None
        if self._node is not None:
            self._node.slots(distributed.rank()).clear()
        self._node = None

    def choose(self, trainer: pl.Trainer, durable: tuple[int, int] | None) -> MemoryResume | None:
        """On every rank, when a fit restores: the snapshot to resume from if every rank can load one at least as new
        as the durable checkpoint at ``durable`` (``(generation, step)``), prepared for Lightning's loader."""
        if self._node is None or self._io is None:
            return None
        plan = plan_restore(distributed.all_gather_object(self._node.inventory()), durable)
        if plan is None:
            return None
        if plan.header.tensor_shapes != tensor_shapes(trainer.lightning_module.state_dict()):
            rank_zero_warn("ResumableCheckpoint: the memory snapshots are of another model; they are not used.")
            return None
        rank = distributed.rank()
        received = self._transfer(plan)
        loads = plan.loads[rank]  # this rank's own old rank, or rank 0 on another world size
        local = self._node.find(loads, plan.key, plan.run_id)
        state: Any = None
        try:
            if received is not None:
                _, skeleton, refs = decode_meta(received[0])
                state = unpack(skeleton, refs, tensors_from_buffer(refs, received[1]))
            else:
                _, state = self._node.slots(loads).read(local)  # type: ignore[arg-type]
        except (OSError, ValueError, EOFError) as err:
            rank_zero_warn(f"ResumableCheckpoint: a memory snapshot could not be read ({err}).")
        if not distributed.all_ranks(state is not None):  # a snapshot gone since it was listed
            return None
        checkpoint = put_rank_local(
            state["checkpoint"], lambda r: state["rank_local"] if r == loads else self._rank_local(r, plan)
        )
        if received is not None:
            path = f"a memory snapshot of step {plan.step} received from rank {plan.sources[rank]}'s node"
        else:
            path = str(self._node.slots(loads).directory / f"slot{local}.meta")
        self._io.preload(path, checkpoint)
        for held in self._node.ranks():  # snapshots ahead of this one are of a trajectory that is not resumed
            self._node.slots(held).discard(lambda h: h.key <= plan.key)
        return MemoryResume(path, plan.header, None if received is None else plan.sources[rank])

    def _transfer(self, plan: RestorePlan) -> tuple[bytes, torch.Tensor] | None:
        """Send the snapshots this node holds for ranks whose nodes do not; this rank's own, if it receives one."""
        transfers = plan.transfers()
        if not transfers:
            return None
        assert self._node is not None
        group = distributed.new_group("gloo")  # the default group may not carry CPU tensors (nccl)
        rank, received = distributed.rank(), None
        try:
            for sender, receiver in transfers:
                if rank == sender:
                    wanted = plan.loads[receiver]
                    slot = self._node.find(wanted, plan.key, plan.run_id)
                    meta, buffer = self._node.slots(wanted).read_raw(slot)  # type: ignore[arg-type]
                    meta_blob = torch.frombuffer(bytearray(meta), dtype=torch.uint8)
                    distributed.send_blobs([meta_blob, buffer], receiver, group)
                elif rank == receiver:
                    meta_blob, buffer = distributed.receive_blobs(2, sender, group)
                    received = (meta_blob.numpy().tobytes(), buffer)
        finally:
            distributed.destroy_group(group)
        return received

    def _rank_local(self, rank: int, plan: RestorePlan) -> Any:
        """Rank ``rank``'s own values of the snapshot of ``plan``, when this node holds it."""
        assert self._node is not None
        slot = self._node.find(rank, plan.key, plan.run_id)
        if slot is None:
            raise ConfigurationError(
                f"Resuming from memory needs rank {rank}'s values of step {plan.step}, which this node does not hold. "
                "Resume on the world size that wrote the snapshots, or with ResumableCheckpoint("
                "snapshot_every_n_steps=None) from the durable checkpoints."
            )
        _, state = self._node.slots(rank).read(slot)
        return state["rank_local"]


def holds_rank_specific_state(strategy: object) -> bool:
    """Whether each rank's checkpoint under ``strategy`` differs from the others': ZeRO's shares and PowerSGD's error
    feedback do; fp16/bf16 compression keeps no state, and plain ``data_parallel`` is ``ddp``."""
    if not isinstance(strategy, DataParallelStrategy):
        return False
    return strategy.zero_stage > 0 or strategy.grad_compression == "powersgd"


def memory_snapshots(
    every_n_steps: int | Literal["auto"] | None, max_overhead: float, mtbi_hours: float | None, lineage: RunLineage
) -> MemorySnapshots | None:
    """The memory snapshots ``ResumableCheckpoint(snapshot_every_n_steps=..., snapshot_max_overhead=...)`` asks for
    (``None``: off), its arguments checked."""
    if every_n_steps is None:
        return None
    if every_n_steps != "auto" and (not isinstance(every_n_steps, int) or every_n_steps < 1):
        raise ConfigurationError(
            f"snapshot_every_n_steps={every_n_steps!r} must be an integer >= 1, 'auto', or None for no memory "
            "snapshots (--checkpoint.snapshot_every_n_steps)."
        )
    if not 0 < max_overhead < 1:
        raise ConfigurationError(
            f"snapshot_max_overhead={max_overhead} must be between 0 and 1, the share of step time that memory "
            "snapshots may take (--checkpoint.snapshot_max_overhead 0.01)."
        )
    mtbf = None if mtbi_hours is None else mtbi_hours * 3600.0
    cadence = SnapshotCadence(None if every_n_steps == "auto" else every_n_steps, max_overhead, mtbf)
    return MemorySnapshots(cadence, lineage)
