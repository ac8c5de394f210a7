"""What the warm-restart parents of a job tell each other, as keys of a store they share (no process group).

Per attempt ``k`` of the training processes: the port of that attempt's process-group store (chosen by rank 0's
parent), each child's progress (:mod:`~lightning_scale.restart.beacon`), a counter of parents whose training process
failed with each one's reason, the ranks found hung by their peers, and a counter of parents ready to start attempt
``k + 1``. Per parent, a heartbeat counter that it raises while it lives: a parent whose heartbeat
stands still is gone (its node was lost) and no attempt can start without it. Per job, the port of rank 0's parent's
links (:mod:`~lightning_scale.restart.links`), the parents it lost a link to, and the parents that ended with their
training's final code (done, a usage error, a preemption): neither a closed link nor a still heartbeat of theirs is
a lost node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning_scale.restart.beacon import Progress

__all__ = ["AttemptBoard"]


class AttemptBoard:
    """The shared keys of one job's parents.

    Args:
        store: A ``torch.distributed.Store`` (``add``, ``set``, ``get``, ``check``), its keys for this job only.
        rank: This parent's rank.
        world_size: Parents of the job.
        clock: Monotonic seconds.

    Examples:
        >>> import torch.distributed as dist
        >>> board = AttemptBoard(dist.HashStore(), rank=1, world_size=2)
        >>> board.failed(0)
        False
        >>> board.fail(0, "rank 1's training process was killed by SIGKILL")
        >>> board.failed(0), board.reasons(0)
        (True, ["rank 1's training process was killed by SIGKILL"])
    """

    def __init__(self, store: Any, rank: int, world_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.clock = clock
        self._seen: dict[int, tuple[int, float]] = {}  # peer -> (its heartbeat count, when it last moved)

    def publish_port(self, attempt: int, port: int) -> None:
        self.store.set(f"attempt/{attempt}/port", str(port))

    def port(self, attempt: int) -> int:
        """The port rank 0's parent chose for ``attempt`` (waits for it, up to the store's timeout)."""
        return int(self.store.get(f"attempt/{attempt}/port"))

    def fail(self, attempt: int, reason: str) -> None:
        """Say that this parent's training process of ``attempt`` failed, and why."""
        self.store.set(f"attempt/{attempt}/why/{self.rank}", reason)
        self.store.add(f"attempt/{attempt}/failed", 1)

    def failed(self, attempt: int) -> bool:
        """Whether some parent said its training process of ``attempt`` failed."""
        return bool(self.store.check([f"attempt/{attempt}/failed"]))

    def reasons(self, attempt: int) -> list[str]:
        """Every reason given for ``attempt``'s failure, in rank order."""
        keys = [f"attempt/{attempt}/why/{rank}" for rank in range(self.world_size)]
        return [self.store.get(key).decode() for key in keys if self.store.check([key])]

    def accuse(self, attempt: int, rank: int, reason: str) -> None:
        """Say that rank ``rank``'s training process of ``attempt`` is hung (a failure of that attempt)."""
        self.store.set(f"attempt/{attempt}/accused/{rank}", reason)
        self.fail(attempt, reason)

    def accused(self, attempt: int) -> bool:
        """Whether this parent's training process of ``attempt`` was found hung."""
        return bool(self.store.check([f"attempt/{attempt}/accused/{self.rank}"]))

    def publish_progress(self, attempt: int, progress: Progress) -> None:
        self.store.set(
            f"attempt/{attempt}/progress/{self.rank}",
            f"{progress.count},{int(progress.watched)},{progress.allowance_s}",
        )

    def progress(self, attempt: int) -> list[Progress | None]:
        """Every rank's published progress of ``attempt`` (``None`` for a rank that published none yet)."""
        keys = [f"attempt/{attempt}/progress/{rank}" for rank in range(self.world_size)]
        found: list[Progress | None] = []
        for key in keys:
            if not self.store.check([key]):
                found.append(None)
                continue
            count, watched, allowance = self.store.get(key).decode().split(",")
            found.append(Progress(int(count), watched == "1", float(allowance)))
        return found

    def arrive(self, attempt: int) -> None:
        """This parent is ready to start ``attempt``."""
        self.store.add(f"attempt/{attempt}/ready", 1)

    def everyone_arrived(self, attempt: int) -> bool:
        return int(self.store.add(f"attempt/{attempt}/ready", 0)) >= self.world_size

    def beat(self) -> None:
        """This parent lives."""
        self.store.add(f"alive/{self.rank}", 1)

    def publish_links_port(self, port: int) -> None:
        self.store.set("links/port", str(port))

    def links_port(self) -> int:
        """The port rank 0's parent takes links on (waits for it, up to the store's timeout)."""
        return int(self.store.get("links/port"))

    def say_gone(self, rank: int) -> None:
        """Say that rank ``rank``'s parent is gone (rank 0's parent, which lost its link)."""
        self.store.set(f"gone/{rank}", "1")
        self.store.add("gone/count", 1)

    def say_final(self) -> None:
        """Say that this parent ends with its training's final code (a request answered once the store holds it: a
        peer that sees this parent end then finds it said)."""
        self.store.set(f"final/{self.rank}", "1")
        self.store.check([f"final/{self.rank}"])

    def said_final(self, rank: int) -> bool:
        return bool(self.store.check([f"final/{rank}"]))

    def gone(self) -> list[int]:
        """The ranks said to be gone (one store request while there are none)."""
        if int(self.store.add("gone/count", 0)) == 0:
            return []
        return [rank for rank in range(self.world_size) if self.store.check([f"gone/{rank}"])]

    def silent_peers(self, timeout_s: float) -> list[int]:
        """Peers whose heartbeat has not moved for ``timeout_s`` (from when this parent first looked), but for those
        that ended with their training's final code."""
        now, silent = self.clock(), []
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            count = int(self.store.add(f"alive/{peer}", 0))
            seen = self._seen.get(peer)
            if seen is None or seen[0] != count:
                self._seen[peer] = (count, now)
            elif now - seen[1] > timeout_s and not self.said_final(peer):
                silent.append(peer)
        return silent
