"""The private part of CPython that ``_python_internals.py`` wraps, checked so that a Python upgrade fails here."""

from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_scale import _python_internals


def test_run_exit_functions_runs_what_atexit_registered_in_a_process_that_leaves_with_os_exit():
    script = (
        "import atexit, os\n"
        "from lightning_scale._python_internals import run_exit_functions\n"
        "atexit.register(print, 'exit function ran')\n"
        "run_exit_functions()\n"
        "os._exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout == "exit function ran\n"


_ADOPT = """
import os, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_scale._python_internals import adopt_forkserver, forkserver_pid
from lightning_scale.data.forkserver import kill_forkserver_workers, start_forkserver

def worker_parent(loader):
    it = iter(loader)
    next(it)
    return [w.pid for w in it._workers], it

if __name__ == "__main__":
    server = start_forkserver()
    data = TensorDataset(torch.arange(100.0))
    loader = DataLoader(
        data, batch_size=4, num_workers=2, multiprocessing_context="forkserver", persistent_workers=True
    )
    child = os.fork()
    if child == 0:
        adopt_forkserver()
        pids, it = worker_parent(loader)  # a new server would be a second process; ChildProcessError without adoption
        parents = {int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) for p in pids}
        print("adopted", forkserver_pid() == server, parents == {server}, flush=True)
        os.kill(os.getpid(), 9)  # the workers outlive it: their parent is the server
    os.waitpid(child, 0)
    time.sleep(0.5)
    killed = kill_forkserver_workers(server)
    print("killed", len(killed), flush=True)
    os.kill(server, 9)
    os.waitpid(server, 0)  # reaped: gone, not a zombie
    child = os.fork()
    if child == 0:
        adopt_forkserver()
        pids, it = worker_parent(loader)
        print("relaunched", forkserver_pid() not in (None, server), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
"""


def test_a_forked_child_adopts_its_parents_forkserver_and_relaunches_one_once_it_is_gone(tmp_path):
    script = tmp_path / "adopt.py"
    script.write_text(_ADOPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["adopted True True", "killed 2", "relaunched True"], done.stderr


_TRACKER = """
import multiprocessing, os, sys, time
from lightning_scale._python_internals import start_resource_tracker_apart
if sys.argv[1] == "apart":
    start_resource_tracker_apart()
lock = multiprocessing.get_context("forkserver").Lock()  # a named semaphore, registered with the tracker
from multiprocessing import resource_tracker
print(lock._semlock.name, resource_tracker._resource_tracker._pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("apart", [True, False], ids=["apart", "as-usual"])
def test_the_tracker_started_apart_outlives_a_kill_of_the_ranks_group_and_unlinks_its_semaphores(apart):
    """A rank as torchrun starts it (a session of its own) with a named semaphore, its whole group killed as torchrun
    ends it: the tracker started apart unlinks the semaphore; the usual one dies with the group and leaves it."""
    rank = subprocess.Popen(
        [sys.executable, "-c", _TRACKER, "apart" if apart else "usual"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        name, tracker = rank.stdout.readline().split()  # type: ignore[union-attr]
        semaphore = Path("/dev/shm") / f"sem.{name.lstrip('/')}"
        assert semaphore.exists()
        assert (os.getpgid(int(tracker)) != rank.pid) is apart
    finally:
        os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()
    deadline = time.monotonic() + 10
    while semaphore.exists() and apart and time.monotonic() < deadline:
        time.sleep(0.05)
    assert semaphore.exists() is not apart
    semaphore.unlink(missing_ok=True)  # the usual tracker's leak: not left for the suite's check


def test_start_method_of_a_process_is_its_context_s():
    for method in ("fork", "forkserver", "spawn"):
        process = multiprocessing.get_context(method).Process(target=print)  # not started: the field is set at init
        assert _python_internals.start_method_of(process) == method
    default = multiprocessing.Process(target=print)
    assert _python_internals.start_method_of(default) == multiprocessing.get_start_method()


def test_the_forkserver_s_entry_point_is_the_one_fork_forkserver_mirrors():
    """Elsewhere ``fork_forkserver`` starts nothing and servers are new interpreters again: seconds of CPU per rank."""
    parameters = tuple(inspect.signature(multiprocessing.forkserver.main).parameters)
    assert parameters == _python_internals._FORKSERVER_MAIN
