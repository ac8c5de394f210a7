"""A process that must not outlive its parent: the Linux parent-death signal."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process (SIGKILL) when its parent ``parent`` dies, and exit now if it already did.

    A no-op where ``prctl`` is missing (not Linux). The signal is tied to the parent's thread that started this process:
    start it from a thread that lives as long as the parent (its main thread)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
