"""Copies of each rank's memory snapshots on another node: what a lost node's ranks resume from.

Rank ``r`` sends each snapshot, once committed in its own node's memory, to its *buddy*, the same local rank on the
next node (``(r + local_world_size) mod world_size``), which keeps it in its node's memory as rank ``r``'s: two slots
written in turn, a copy torn by a failure never read, as for the rank's own (:mod:`~lightning_scale.snapshot.slots`).
Sending and receiving run on threads of their own over a gloo group of their own while training goes on; the next
snapshot waits until the previous one is sent, so a slot is never overwritten while it is read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import torch

from lightning_scale import distributed
from lightning_scale.snapshot.node import NodeSnapshots

__all__ = ["PeerCopies"]

log = logging.getLogger(__name__)

_SNAPSHOT, _STOP = 1, 0


class PeerCopies:
    """This rank's side of the copies: it sends its snapshots to its buddy and keeps its source's.

    Args:
        node: This node's snapshots (the copies are kept there, under the source rank's number).
        rank: This rank.
        world_size: Ranks of the job.
        local_world_size: Ranks per node.
        group: A gloo process group of all ranks, for these copies only.
    """

    def __init__(self, node: NodeSnapshots, rank: int, world_size: int, local_world_size: int, group: Any) -> None:
        self.node = node
        self.buddy = (rank + local_world_size) % world_size
        self.source = (rank - local_world_size) % world_size
        self.group = group
        self.failure: str | None = None
        """Why this rank's copies stopped (a peer gone: the job is failing), if they did."""
        self._sending: threading.Thread | None = None
        self._receiving = threading.Thread(target=self._receive, name="lightning-scale-peer-copies", daemon=True)
        self._receiving.start()

    @staticmethod
    def needed(world_size: int, local_world_size: int) -> bool:
        """Whether the job spans several nodes (a copy on this node would not survive its loss)."""
        return world_size > local_world_size

    def send(self, meta: bytes, bulk: torch.Tensor) -> None:
        """Start sending a committed snapshot (its meta and tensor bytes, which must stay unchanged until
        :meth:`wait` returns)."""
        self.wait()
        self._sending = threading.Thread(target=self._send, args=(meta, bulk), daemon=True)
        self._sending.start()

    def busy(self) -> bool:
        """Whether a snapshot is being sent now."""
        return self._sending is not None and self._sending.is_alive()

    def wait(self) -> None:
        """Until the snapshot being sent was received."""
        if self._sending is not None:
            self._sending.join()
            self._sending = None

    def stop(self) -> None:
        """Training finished (every rank): the last copy lands, then both threads end."""
        self.wait()
        if self.failure is None:
            self._header(_STOP, 0, 0)
        self._receiving.join()

    def _send(self, meta: bytes, bulk: torch.Tensor) -> None:
        try:
            self._header(_SNAPSHOT, len(meta), bulk.numel())
            distributed.send_tensor(torch.frombuffer(bytearray(meta), dtype=torch.uint8), self.buddy, self.group)
            if bulk.numel():
                distributed.send_tensor(bulk, self.buddy, self.group)
        except Exception as err:  # the buddy is gone: its job is failing, and the restart finds what landed
            self._failed(f"sending to rank {self.buddy} failed ({err})")

    def _header(self, kind: int, meta_bytes: int, bulk_bytes: int) -> None:
        header = torch.tensor([kind, meta_bytes, bulk_bytes], dtype=torch.int64)
        distributed.send_tensor(header, self.buddy, self.group)

    def _receive(self) -> None:
        slots = self.node.slots(self.source)
        try:
            while True:
                header = torch.empty(3, dtype=torch.int64)
                distributed.receive_into(header, self.source, self.group)
                kind, meta_bytes, bulk_bytes = header.tolist()
                if kind == _STOP:
                    return
                meta = torch.empty(meta_bytes, dtype=torch.uint8)
                distributed.receive_into(meta, self.source, self.group)
                slot = slots.begin()
                if bulk_bytes:
                    distributed.receive_into(slots.buffer(slot, bulk_bytes)[:bulk_bytes], self.source, self.group)
                slots.write_meta(slot, meta.numpy().tobytes())
        except Exception as err:
            self._failed(f"receiving from rank {self.source} failed ({err})")

    def _failed(self, why: str) -> None:
        with contextlib.suppress(Exception):
            log.warning(f"Copies of memory snapshots on another node stopped: {why}.")
        self.failure = why
