"""Checkpoint writes off the training thread: a host-memory copy of the state, then one writer thread.

Training is blocked only while :func:`host_copy` snapshots the state; :class:`BackgroundWriter` then serialises,
uploads and publishes it while training goes on. The writer runs one job at a time and never calls collectives, so
it may run on one rank only.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["BackgroundWriter", "WriteResult", "host_copy"]

T = TypeVar("T")


def host_copy(obj: T) -> T:
    """A deep copy of ``obj`` whose tensors are new host-memory (CPU) tensors, detached from autograd.

    Tensors reachable through dicts, lists and tuples are copied once each (a tensor held twice stays shared);
    everything else is deep-copied, so later in-place updates of parameters or optimizer state cannot reach the copy.

    Example:
        >>> weight = torch.ones(2)
        >>> snapshot = host_copy({"w": weight, "same": weight, "step": 3})
        >>> weight.add_(1)
        tensor([2., 2.])
        >>> snapshot["w"], snapshot["same"] is snapshot["w"]
        (tensor([1., 1.]), True)
    """
    memo: dict[int, Any] = {}
    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor) and id(leaf) not in memo:
            memo[id(leaf)] = leaf.detach().to("cpu", copy=True)
    return copy.deepcopy(obj, memo)


@dataclass(frozen=True)
class WriteResult:
    """How a background job ended: what it was, and its error (``None`` when it succeeded)."""

    what: str
    error: BaseException | None


class BackgroundWriter:
    """Runs write jobs one after another on a single daemon thread; the caller collects their outcome.

    Example:
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
