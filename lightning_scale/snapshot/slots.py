"""One rank's memory snapshots: two slots in a directory of node-local shared memory, written in turn.

A slot is two files: ``slotN.bulk``, the tensors' bytes (mapped once and reused, so that a snapshot after the first is
a copy into memory that is already there), and ``slotN.meta``, the header and the rest of the checkpoint. A write
first removes the slot's meta, then copies, then renames the new meta into place: a process that dies in the middle
of it leaves a slot without meta, which is never read, and the other slot holds the previous snapshot. At most two
snapshots per rank exist; the newest valid one is never overwritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lightning_scale.snapshot.codec import Packed, TensorRef, as_bytes, empty_tensors, unpack

__all__ = ["SLOTS", "SnapshotHeader", "SnapshotSlots", "decode_meta", "encode_meta", "slot_bytes"]

SLOTS = 2
_VERSION = 1
_GROWTH = 1 << 20  # a bulk file is sized in MiB, so that a state that grows a little reuses it


@dataclasses.dataclass(frozen=True)
class SnapshotHeader:
    """What a snapshot is of.

    Attributes:
        rank: The rank whose state it holds.
        world_size: Processes of the job that wrote it.
        step: ``trainer.global_step`` when it was taken.
        epoch: The epoch then.
        generation: The run's generation (as in the checkpoint manifests).
        run_id: The run's id.
        nbytes: Bytes of its tensors.
        created_unix: When it was taken.
        tensor_shapes: Shape of every tensor of the model's state dict.
        portable: Every rank holds the whole state (no shard of its own): a snapshot of any rank resumes any rank of
            another world size.
    """

    rank: int
    world_size: int
    step: int
    epoch: int
    generation: int
    run_id: str
    nbytes: int
    created_unix: float
    tensor_shapes: dict[str, list[int]]
    portable: bool = False

    @property
    def key(self) -> tuple[int, int]:
        """Newer snapshots (and checkpoints) have a larger ``(generation, step)``."""
        return (self.generation, self.step)


@dataclasses.dataclass
class _Mapping:
    file: mmap.mmap
    buffer: torch.Tensor


class SnapshotSlots:
    """The snapshot slots of one rank's state in ``directory`` (created on the first write).

    Args:
        directory: A directory in node-local shared memory (``/dev/shm/...``).

    Examples:
        >>> import tempfile
        >>> from lightning_scale.snapshot.codec import pack
        >>> slots = SnapshotSlots(Path(tempfile.mkdtemp()) / "rank0")
        >>> header = SnapshotHeader(0, 1, step=5, epoch=0, generation=0, run_id="r", nbytes=0, created_unix=0.0,
        ...                         tensor_shapes={})
        >>> slots.write(header, pack({"w": torch.ones(2)}))
        0
        >>> [(slot, h.step) for slot, h in slots.headers()]
        [(0, 5)]
        >>> slots.read(0)[1]
        {'w': tensor([1., 1.])}
        >>> slots.clear()
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._mappings: dict[int, _Mapping] = {}

    def headers(self) -> list[tuple[int, SnapshotHeader]]:
        """``(slot, header)`` of each valid snapshot, oldest first."""
        found = []
        for slot in range(SLOTS):
            header = self._header(slot)
            if header is not None:
                found.append((slot, header))
        return sorted(found, key=lambda item: item[1].key)

    def write(self, header: SnapshotHeader, packed: Packed) -> int:
        """Write a snapshot into the slot that does not hold the newest one; returns the slot (``header.nbytes`` is
        taken from ``packed``)."""
        slot = self.begin()
        packed.copy_into(self.buffer(slot, packed.nbytes))
        self.commit(slot, dataclasses.replace(header, nbytes=packed.nbytes), packed.skeleton, packed.refs)
        return slot

    def begin(self) -> int:
        """Invalidate the slot to write next (:meth:`slot_to_write`) and return it: from here on it is no snapshot."""
        slot = self.slot_to_write()
        self._meta(slot).unlink(missing_ok=True)
        return slot

    def buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        """``slot``'s buffer, mapped (and sized to hold at least ``nbytes``) once and reused."""
        mapping = self._mappings.get(slot)
        if mapping is not None and mapping.buffer.numel() >= nbytes:
            return mapping.buffer
        if mapping is not None:
            del self._mappings[slot]
            del mapping.buffer
            mapping.file.close()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        size = slot_bytes(nbytes)
        descriptor = os.open(self._bulk(slot), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(descriptor, size)
            # the pages are reserved now: a full tmpfs fails here, not with SIGBUS in the middle of a copy
            os.posix_fallocate(descriptor, 0, size)
            file = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self._mappings[slot] = _Mapping(file, torch.frombuffer(file, dtype=torch.uint8))
        return self._mappings[slot].buffer

    def commit(self, slot: int, header: SnapshotHeader, skeleton: bytes, refs: list[TensorRef]) -> None:
        """Make ``slot`` a snapshot once its buffer holds the tensors: its meta is renamed into place."""
        self.write_meta(slot, encode_meta(header, skeleton, refs))

    def write_meta(self, slot: int, meta: bytes) -> None:
        """Make ``slot`` the snapshot that ``meta`` (:func:`encode_meta`) describes (its buffer is filled)."""
        temporary = self._meta(slot).with_suffix(".tmp")
        temporary.write_bytes(meta)
        os.replace(temporary, self._meta(slot))

    def slot_to_write(self) -> int:
        """An empty slot, else the one holding the older snapshot."""
        valid = dict(self.headers())
        empty = [slot for slot in range(SLOTS) if slot not in valid]
        return empty[0] if empty else min(valid, key=lambda slot: valid[slot].key)

    def read(self, slot: int) -> tuple[SnapshotHeader, Any]:
        """The header and the state of the snapshot in ``slot``, in this process's own memory."""
        header, skeleton, refs = decode_meta(self._meta(slot).read_bytes())
        tensors = empty_tensors(refs)
        with open(self._bulk(slot), "rb") as handle:
            for tensor, ref in zip(tensors, refs, strict=True):
                handle.seek(ref.offset)
                if ref.nbytes and handle.readinto(as_bytes(tensor).numpy().data) != ref.nbytes:
                    raise OSError(f"{self._bulk(slot)} is shorter than its snapshot's {header.nbytes} bytes")
        return header, unpack(skeleton, refs, tensors)

    def read_raw(self, slot: int) -> tuple[bytes, torch.Tensor]:
        """The meta of ``slot`` and a copy of its tensor bytes (to send to another rank as they are)."""
        meta = self._meta(slot).read_bytes()
        header, _, _ = decode_meta(meta)
        buffer = torch.empty(header.nbytes, dtype=torch.uint8)
        with open(self._bulk(slot), "rb") as handle:
            if header.nbytes and handle.readinto(buffer.numpy().data) != header.nbytes:
                raise OSError(f"{self._bulk(slot)} is shorter than the {header.nbytes} bytes its snapshot needs")
        return meta, buffer

    def discard(self, keep: Callable[[SnapshotHeader], bool]) -> None:
        """Invalidate the snapshots for which ``keep(header)`` is false."""
        for slot, header in self.headers():
            if not keep(header):
                self._meta(slot).unlink(missing_ok=True)

    def mapped_bytes(self, slot: int) -> int:
        """Bytes of ``slot``'s buffer this process has mapped (0: none yet)."""
        mapping = self._mappings.get(slot)
        return 0 if mapping is None else mapping.buffer.numel()

    def close(self) -> None:
        """Unmap the buffers (the files stay); safe to call twice."""
        for mapping in self._mappings.values():
            del mapping.buffer
            with contextlib.suppress(BufferError):  # a view is still in use (a copy being received): unmapped later
                mapping.file.close()
        self._mappings.clear()

    def clear(self) -> None:
        """Remove every file of these slots and the directory."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _header(self, slot: int) -> SnapshotHeader | None:
        try:
            header, _, _ = decode_meta(self._meta(slot).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError):
            return None  # no snapshot there (being written, torn, or from another release)
        with contextlib.suppress(OSError):
            if self._bulk(slot).stat().st_size >= header.nbytes:
                return header
        return None

    def _meta(self, slot: int) -> Path:
        return self.directory / f"slot{slot}.meta"

    def _bulk(self, slot: int) -> Path:
        return self.directory / f"slot{slot}.bulk"


def slot_bytes(nbytes: int) -> int:
    """The shared memory a slot takes for a snapshot of ``nbytes`` of tensors (sized in MiB, so that a state that
    grows a little reuses it)."""
    return max(_GROWTH, -(-nbytes // _GROWTH) * _GROWTH)


def encode_meta(header: SnapshotHeader, skeleton: bytes, refs: list[TensorRef]) -> bytes:
    """A slot's meta: the header, the checkpoint's skeleton and where its tensors lie."""
    return pickle.dumps({"version": _VERSION, "header": header, "skeleton": skeleton, "refs": refs})


def decode_meta(meta: bytes) -> tuple[SnapshotHeader, bytes, list[TensorRef]]:
    """What :func:`encode_meta` wrote; ``ValueError`` for a meta of another release."""
    data = pickle.loads(meta)
    if data.get("version") != _VERSION or not isinstance(data.get("header"), SnapshotHeader):
        raise ValueError(f"memory snapshot of version {data.get('version')!r}, not {_VERSION}")
    return data["header"], data["skeleton"], data["refs"]
