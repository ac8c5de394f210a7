"""Killing a whole training job the way a lost machine does: every process of its tree at once, with SIGKILL.

``torchrun`` starts each worker in a session of its own, so killing the launcher's process group leaves the workers
running; the tree has to be found from ``/proc`` (Linux).

Multiprocessing's resource trackers in the tree are spared: each ends by itself once the processes that use it are
gone, and unlinks the named semaphores they leave in ``/dev/shm`` (DataLoader queues' locks), which a lost machine's
memory takes with it but a machine that only simulates the loss would keep. For the same reason the shared-memory
segments of torch tensors that a killed process was handing to another (``/dev/shm/torch_<pid>_*``, unlinked by torch
once received) are removed with it, and so are the named semaphores a killed tree had mapped that no process maps
once it is gone (a tracker that unlinks them first leaves nothing to remove; one killed with its tree would leave
them). The tree is stopped before it is killed: a process forked while it was being killed (a DataLoader worker
from a forkserver) would otherwise outlive it.

What a finished job left behind is found by a mark in the environment (:data:`JOB_MARK`), which every process of
the job inherits: DataLoader workers started from a forkserver carry no part of the job's command line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from lightning_scale._linux import parent_ids, process_environment, process_state

__all__ = [
    "JOB_MARK",
    "descendants",
    "job_environment",
    "kill_process_tree",
    "kill_processes",
    "processes_of_job",
    "shared_memory_holders",
]

_SHARED_MEMORY = Path("/dev/shm")

JOB_MARK = "LIGHTNING_SCALE_TEST_JOB"
"""The environment variable that names the job a process belongs to (see :func:`job_environment`)."""


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, parents before children."""
    children: dict[int, list[int]] = {}
    for child, parent in parent_ids().items():
        children.setdefault(parent, []).append(child)
    found, frontier = [], [pid]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, [])]
        found += below
        frontier = below
    return found


def kill_process_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` and every process below it (the launcher first, so it cannot restart workers) but
    resource trackers (see the module's description). With SIGKILL, the tree is stopped first, so that no process
    of it starts another while it is killed (one started then would outlive it, its parent gone), and the named
    semaphores of the tree go with it."""
    tree = _stopped_tree(pid) if sig == signal.SIGKILL else [pid, *descendants(pid)]
    mapped = {inode for target in tree for inode in _mapped_shared_memory(target)}
    killed = kill_processes(tree, sig)
    if sig == signal.SIGKILL and mapped:
        deadline = time.monotonic() + 5
        while any(_mapped_shared_memory(target) for target in killed) and time.monotonic() < deadline:
            time.sleep(0.05)  # a killed process's memory is released once it is gone (a zombie maps nothing)
        orphans = mapped - {inode for other in descendants(1) for inode in _mapped_shared_memory(other)}
        for semaphore in _SHARED_MEMORY.glob("sem.*"):
            with contextlib.suppress(OSError):
                if semaphore.stat().st_ino in orphans:
                    semaphore.unlink()


def kill_processes(pids: list[int], sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to each of ``pids`` in turn but resource trackers (see the module's description); those sent it.
    With SIGKILL, the machine's memory of the processes killed goes too: their torch shared-memory segments."""
    sent = []
    for target in pids:
        with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
            if not _resource_tracker(target):
                os.kill(target, sig)
                sent.append(target)
    if sig == signal.SIGKILL:
        for target in sent:
            for segment in _SHARED_MEMORY.glob(f"torch_{target}_*"):
                segment.unlink(missing_ok=True)
    return sent


def _stopped_tree(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first, each stopped (SIGSTOP) but resource trackers: listed again
    once those found have stopped, until no new one appears."""
    seen: list[int] = []
    while new := [target for target in (pid, *descendants(pid)) if target not in seen]:
        seen += new
        for target in kill_processes(new, signal.SIGSTOP):
            deadline = time.monotonic() + 2
            while process_state(target) not in ("T", "t", "Z", "X", None) and time.monotonic() < deadline:
                time.sleep(0.001)  # the signal is taken when the process next runs: it may still fork until then
    return seen


def _mapped_shared_memory(pid: int) -> set[int]:
    """The inodes of the ``/dev/shm`` files process ``pid`` maps (a named semaphore's creator maps it under the
    temporary name it had before it was linked to its own, so the inode is what identifies it)."""
    with contextlib.suppress(OSError):
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        entries = [fields for fields in (line.split(maxsplit=5) for line in maps) if len(fields) == 6]
        return {int(fields[4]) for fields in entries if fields[5].startswith(f"{_SHARED_MEMORY}/")}
    return set()


def shared_memory_holders(names: list[str]) -> dict[str, list[str]]:
    """For each of ``names`` (entries of ``/dev/shm``), the live processes that map it, each as its id, the job it is
    marked as (:data:`JOB_MARK`) and its command line: who made what a run left there, while they still live."""
    inodes = {}
    for name in names:
        with contextlib.suppress(OSError):  # gone meanwhile
            inodes[(_SHARED_MEMORY / name).stat().st_ino] = name
    holders: dict[str, list[str]] = {name: [] for name in names}
    for pid in descendants(1) if inodes else []:
        for inode in _mapped_shared_memory(pid) & inodes.keys():
            job = process_environment(pid).get(JOB_MARK, "-")
            with contextlib.suppress(OSError):
                command = " ".join(Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ").split())
                holders[inodes[inode]].append(f"{pid} job={job} {command[:160]}")
    return holders


def _resource_tracker(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def job_environment(job: Path | str) -> dict[str, str]:
    """The environment entry that marks every process a launch starts (ranks, their workers, forkservers and the
    workers forked from those) as ``job``'s, for :func:`processes_of_job`."""
    return {JOB_MARK: str(job)}


def processes_of_job(job: Path | str) -> list[int]:
    """Live processes marked as ``job``'s (:func:`job_environment`): what a finished job left behind."""
    wanted = f"{JOB_MARK}={job}".encode()
    found = []
    for pid in descendants(1):
        with contextlib.suppress(OSError):  # the process ended while we looked, or is not ours to read
            if wanted in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
    return found
