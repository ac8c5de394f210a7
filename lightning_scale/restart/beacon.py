"""A training process's progress where its warm-restart parent reads it: three numbers in memory shared across fork.

The parent creates the :class:`Beacon` before it forks; ``HangWatchdog`` in the child raises its count at every
progress mark and says whether the phase it is in is one whose length the step times predict (``watched``), with the
allowance its peers should give it there. The parents compare their children's counts
(:class:`~lightning_scale.restart.hangs.PeerHangJudge`): a rank behind the others while they all wait for it is hung,
long before its own watchdog's allowance for a lone rank runs out.
"""

from __future__ import annotations

import dataclasses
import mmap
import struct

__all__ = ["Beacon", "Progress", "current", "install"]

_LAYOUT = struct.Struct("=qqd")  # count, watched, allowance_s: each 8-byte aligned, written whole


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a training process last said: its count of progress marks, whether its phase is watched by its peers,
    and how long they may wait for its next mark there."""

    count: int
    watched: bool
    allowance_s: float


class Beacon:
    """Progress marks of the child, readable by its parent.

    Examples:
        >>> beacon = Beacon()
        >>> beacon.mark(watched=True, allowance_s=10.0)
        >>> beacon.read()
        Progress(count=1, watched=True, allowance_s=10.0)
    """

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, _LAYOUT.size)  # anonymous and shared: a child forked later writes the same pages
        self._count = 0

    def mark(self, watched: bool, allowance_s: float) -> None:
        """One more progress mark (in the child)."""
        self._count += 1
        _LAYOUT.pack_into(self._memory, 0, self._count, int(watched), allowance_s)

    def read(self) -> Progress:
        count, watched, allowance = _LAYOUT.unpack_from(self._memory, 0)
        return Progress(count, bool(watched), allowance)

    def reset(self) -> None:
        """Before a new child starts: nothing said yet."""
        self._count = 0
        _LAYOUT.pack_into(self._memory, 0, 0, 0, 0.0)


_CURRENT: Beacon | None = None


def install() -> Beacon:
    """Create this process's beacon (in the parent, before forking); its children find it with :func:`current`."""
    global _CURRENT
    _CURRENT = Beacon()
    return _CURRENT


def current() -> Beacon | None:
    """The beacon of the parent this process was forked from, if any."""
    return _CURRENT
