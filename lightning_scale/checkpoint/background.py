"""Checkpoint writes off the training thread: a host-memory copy of the state, then one writer thread.

Training is blocked only while :class:`HostStager` snapshots the state; :class:`BackgroundWriter` then serialises,
uploads and publishes it while training goes on, one job at a time.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from lightning_scale._torch_internals import tree_leaves

__all__ = ["BackgroundWriter", "HostStager", "WriteResult", "host_copy"]

T = TypeVar("T")


def host_copy(obj: T, buffers: dict[int, torch.Tensor] | None = None) -> T:
    """A deep copy of ``obj`` whose tensors are new host-memory (CPU) tensors, detached from autograd.

    Tensors reachable through dicts, lists and tuples are copied once each (a tensor held twice stays shared);
    everything else is deep-copied, so later in-place updates of parameters or optimizer state cannot reach the copy.
    ``buffers`` (``{position: tensor}``, updated here) are host tensors of an earlier copy to copy into where shape
    and dtype match: no fresh allocation, no page faults on first touch.

    Examples:
        >>> weight = torch.ones(2)
        >>> snapshot = host_copy({"w": weight, "same": weight, "step": 3})
        >>> weight.add_(1)
        tensor([2., 2.])
        >>> snapshot["w"], snapshot["same"] is snapshot["w"]
        (tensor([1., 1.]), True)
    """
    memo: dict[int, Any] = {}
    tensors = [leaf for leaf in tree_leaves(obj) if isinstance(leaf, torch.Tensor)]
    for position, tensor in enumerate(tensors):
        if id(tensor) in memo:
            continue
        buffer = None if buffers is None else buffers.get(position)
        if buffer is not None and _fits(buffer, tensor):
            _local(buffer).copy_(_local(tensor).detach())
        else:
            buffer = tensor.detach().to("cpu", copy=True)
        if buffers is not None:
            buffers[position] = buffer
        memo[id(tensor)] = buffer
    return copy.deepcopy(obj, memo)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or a DTensor's local shard (a view: copying into it fills the DTensor)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _fits(buffer: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` can be copied into ``buffer``: the same kind, strided, the same local shape and dtype, and
    for a DTensor (a sharded model's state) the same placements on the same mesh."""
    if type(buffer) is not type(tensor) or tensor.layout != torch.strided:
        return False
    if hasattr(tensor, "to_local") and (
        buffer.placements != tensor.placements or buffer.device_mesh != tensor.device_mesh  # type: ignore[attr-defined]
    ):
        return False
    local, own = _local(buffer), _local(tensor)
    same = local.shape == own.shape and local.dtype == own.dtype
    return same and local.is_contiguous() and local.device.type == "cpu"


class HostStager:
    """Host copies of the state (:func:`host_copy`) into the buffers of the previous one.

    Reuse is safe only once the previous copy was written: stage the next state after the writer finished.

    Examples:
        >>> stager, weight = HostStager(), torch.zeros(3)
        >>> first = stager.copy({"w": weight})["w"]
        >>> second = stager.copy({"w": weight.add_(1)})["w"]
        >>> second.data_ptr() == first.data_ptr(), second
        (True, tensor([1., 1., 1.]))
    """

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}

    def copy(self, obj: T) -> T:
        return host_copy(obj, self._buffers)

    def clear(self) -> None:
        self._buffers = {}


@dataclass(frozen=True)
class WriteResult:
    """How a background job ended: what it was, and its error (``None`` when it succeeded)."""

    what: str
    error: BaseException | None


class BackgroundWriter:
    """Runs write jobs one after another on a single daemon thread; the caller collects their outcome.

    Examples:
        >>> writer = BackgroundWriter()
        >>> writer.submit(lambda: None, "fine")
        >>> writer.submit(lambda: 1 / 0, "broken")
        >>> [(result.what, type(result.error).__name__) for result in writer.wait()]
        [('fine', 'NoneType'), ('broken', 'ZeroDivisionError')]
        >>> writer.close()
        []
    """

    def __init__(self, name: str = "lightning-scale-checkpoint") -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._jobs: list[tuple[str, Future[None]]] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None], what: str) -> None:
        """Queue ``job``; it runs after every job queued before it."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
            self._jobs.append((what, self._executor.submit(job)))

    @property
    def busy(self) -> bool:
        """Whether a queued job has not finished yet."""
        with self._lock:
            return any(not future.done() for _, future in self._jobs)

    def wait(self) -> list[WriteResult]:
        """Block until every queued job finished; return how each ended, in order (each job reported once)."""
        with self._lock:
            jobs, self._jobs = self._jobs, []
        return [WriteResult(what, future.exception()) for what, future in jobs]

    def close(self) -> list[WriteResult]:
        """Wait for the queued jobs, stop the thread, and return the results not collected yet."""
        results = self.wait()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        return results
