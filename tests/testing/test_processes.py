"""``lightning_scale.testing.processes``: a simulated lost machine takes its processes' shared memory with them, and
what a job leaves behind is found, forkserver workers included."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from lightning_scale._linux import parent_ids
from lightning_scale.testing import launch_environment
from lightning_scale.testing.processes import (
    job_environment,
    kill_process_tree,
    kill_processes,
    processes_of_job,
    shared_memory_holders,
)


def test_a_killed_process_takes_its_torch_shared_memory_segments_and_no_other_process_s():
    victim, bystander = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        segments = {pid: Path(f"/dev/shm/torch_{pid}_123_0") for pid in (victim.pid, bystander.pid)}
        for segment in segments.values():
            segment.write_bytes(b"tensor")
        assert kill_processes([victim.pid]) == [victim.pid]
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert not segments[victim.pid].exists() and segments[bystander.pid].exists()
    finally:
        bystander.kill()
        bystander.wait()
        segments[bystander.pid].unlink(missing_ok=True)


def test_a_killed_tree_takes_the_named_semaphores_it_mapped_even_when_its_tracker_died_first():
    """What a lost machine's memory takes with it, where the tracker that would unlink it is gone (the CI run of
    ea48cc8 kept a DataLoader queue's ``sem.mp-*`` after a lost node); a semaphore another process maps stays."""
    holder = (
        "import multiprocessing, sys\n"
        "lock = multiprocessing.get_context('spawn').Lock()\n"
        "print(lock._semlock.name, flush=True)\n"
        "sys.stdin.read()\n"
    )
    victim, bystander = (
        subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    )
    try:
        semaphores = {
            p.pid: Path(f"/dev/shm/sem.{p.stdout.readline().strip().lstrip('/')}") for p in (victim, bystander)
        }
        assert all(semaphore.exists() for semaphore in semaphores.values())
        parents = parent_ids()
        [tracker] = [
            pid for pid, parent in parents.items() if parent == victim.pid and b"resource_tracker" in _cmdline(pid)
        ]
        assert kill_processes([tracker]) == []  # trackers are spared
        subprocess.run(["kill", "-9", str(tracker)], check=True)  # gone before the tree, as if killed with its group
        kill_process_tree(victim.pid)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert not semaphores[victim.pid].exists() and semaphores[bystander.pid].exists()
    finally:
        for process in (victim, bystander):
            if process.poll() is None:
                process.communicate("", timeout=60)


def test_a_job_s_forkserver_workers_are_found_by_its_mark_which_their_command_lines_lack(tmp_path):
    """The check that a finished job left nothing behind sees the DataLoader workers that jobs actually start."""
    script = tmp_path / "loader.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "from torch.utils.data import DataLoader\n\n"
        "if __name__ == '__main__':\n"
        "    loader = DataLoader(list(range(64)), num_workers=2, multiprocessing_context='forkserver')\n"
        "    batches = iter(loader)\n"
        "    next(batches)\n"
        "    print('running', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    job = tmp_path / "job"
    env = launch_environment([], **job_environment(job))
    process = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "running\n"
        marked = processes_of_job(job)
        parents = parent_ids()
        [server] = [pid for pid in marked if parents.get(pid) == process.pid and b"forkserver" in _cmdline(pid)]
        workers = [pid for pid in marked if parents.get(pid) == server]
        assert process.pid in marked and len(workers) == 2  # the rank, its forkserver and the two workers from it
        assert all(str(job).encode() not in _cmdline(pid) for pid in workers)  # a command-line search misses them
        assert processes_of_job(tmp_path / "other") == []
    finally:
        process.communicate("", timeout=60)
    deadline = time.monotonic() + 30
    while processes_of_job(job) and time.monotonic() < deadline:  # the workers and the forkserver end with it
        time.sleep(0.1)
    assert processes_of_job(job) == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_tree_that_keeps_forking_is_killed_whole(tmp_path):
    """No process forked while the tree is being killed outlives it (reparented away from the tree, it would)."""
    forker = (
        "import os, sys, time\n"
        "print('forking', flush=True)\n"
        "for _ in range(400):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    time.sleep(0.002)\n"
        "sys.stdin.read()\n"
    )
    job = tmp_path / "forking"
    process = subprocess.Popen(
        [sys.executable, "-c", forker], env=launch_environment([], **job_environment(job)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline() == "forking\n"
        time.sleep(0.1)
        kill_process_tree(process.pid)
        assert process.wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.2)  # a process forked meanwhile would be running now
        assert processes_of_job(job) == []
    finally:
        for pid in processes_of_job(job):
            kill_processes([pid])


def test_the_holders_of_a_named_semaphore_are_named_with_their_job(tmp_path):
    """What the suite's /dev/shm guard prints for an entry left behind: who mapped it when it was first seen."""
    holder = (
        "import multiprocessing, sys\n"
        "lock = multiprocessing.get_context('spawn').Lock()\n"
        "print(lock._semlock.name, flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = launch_environment([], **job_environment(tmp_path / "job"))
    process = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        name = f"sem.{process.stdout.readline().strip().lstrip('/')}"
        holders = shared_memory_holders([name, "sem.not-there"])
        assert holders["sem.not-there"] == []
        [holder_line] = holders[name]
        assert holder_line.startswith(f"{process.pid} job={tmp_path / 'job'} {sys.executable} -c")
    finally:
        process.communicate("", timeout=60)
