"""Linux process relations: a process that must not outlive its parent (the parent-death signal), who is whose
parent, what state a process is in, when it started and what environment it started with (``/proc``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

__all__ = ["die_with_parent", "parent_ids", "process_environment", "process_start", "process_state"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process (SIGKILL) when its parent ``parent`` dies, and exit now if it already did.

    A no-op where ``prctl`` is missing (not Linux). The signal is tied to the parent's thread that started this process:
    start it from a thread that lives as long as the parent (its main thread)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def parent_ids() -> dict[int, int]:
    """Every live process's id and its parent's, from ``/proc``."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the fields after the command's name, which may hold spaces and parentheses: state, then the parent's id
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def process_state(pid: int) -> str | None:
    """Process ``pid``'s state letter from ``/proc`` (``R`` running, ``S`` sleeping, ``T`` stopped, ``Z`` a zombie:
    dead, not yet reaped by its parent), ``None`` once it is gone."""
    with contextlib.suppress(OSError, IndexError):
        # after the command's name, which may hold spaces and parentheses
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc``): with its id, it names one process, where
    the id alone is reused. ``None`` once it is gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        # field 22; the 20th after the command's name, which may hold spaces and parentheses
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return None


def process_environment(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with (``/proc/PID/environ``; changes it made since are not in it),
    empty once it is gone or when it is not ours to read."""
    with contextlib.suppress(OSError):
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)
    return {}
