"""A rank killed with SIGKILL leaves none of its DataLoader's forkserver processes behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

_RANK = """
import os, signal, sys
sys.path[:0] = {path!r}
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_scale.data.forkserver import safe_worker_context

if __name__ == "__main__":
    data = TensorDataset(torch.randn(1000, 4))
    context = safe_worker_context(DataLoader(data, batch_size=4, num_workers=2), "loader")
    batches = iter(DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context=context))
    next(batches)  # the forkserver and both workers run
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (every process the rank started inherits it)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
    return found


@pytest.mark.timeout(180)
def test_the_forkserver_and_its_workers_die_with_a_killed_rank(tmp_path):
    marker = f"LIGHTNING_SCALE_TEST_MARK={uuid.uuid4().hex}"
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(_RANK.format(path=sys.path)))
    env = {**os.environ, "LIGHTNING_SCALE_TEST_MARK": marker.split("=")[1]}
    done = subprocess.run([sys.executable, str(script)], env=env, timeout=90)
    assert done.returncode == -signal.SIGKILL
    # the forkserver leaves once the rank's end closes its pipe; workers look for their parent every 5 s: seconds
    # on an idle machine, the deadline leaves room for a loaded one
    assert _left_after(marker, 60) == {}


_LATE_WORKER = """
import os, signal, sys, time
sys.path[:0] = {path!r}
import torch
from torch.utils.data import DataLoader, Dataset
from lightning_scale.data.forkserver import safe_worker_context


class SlowToArrive(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.tensor(index)

    def __setstate__(self, state):  # in the worker, before it starts: the rank and its server die meanwhile
        time.sleep(3)
        self.__dict__.update(state)


if __name__ == "__main__":
    data = SlowToArrive()
    context = safe_worker_context(DataLoader(data, num_workers=1), "loader")
    batches = iter(DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context=context))
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(180)
def test_a_worker_that_starts_after_its_killed_rank_took_the_forkserver_with_it_exits_too(tmp_path):
    """A worker watches the parent it finds at its start; one that starts after the server died would watch init and
    wait forever, holding the job's resource tracker and semaphores."""
    marker = uuid.uuid4().hex
    script = tmp_path / "rank.py"
    script.write_text(_LATE_WORKER.format(path=sys.path))
    env = {**os.environ, "LIGHTNING_SCALE_TEST_MARK": marker}
    done = subprocess.run([sys.executable, str(script)], env=env, timeout=90)
    assert done.returncode == -signal.SIGKILL
    assert _left_after(marker, 30) == {}  # the worker's 3 s of unpickling, then its start


def _left_after(marker: str, seconds: float) -> dict[int, str]:
    """The processes carrying ``marker`` that are still there after ``seconds`` at most, by command line; killed, so
    that a failure leaves nothing behind."""
    deadline = time.monotonic() + seconds
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: _command(pid) for pid in _marked(marker)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:200]
    return "(ended)"


def test_an_evaluation_loader_s_workers_take_a_forkserver_only_in_a_distributed_run_without_a_chosen_context():
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lightning_scale.data.forkserver import start_workers_safely

    def context_after(loader, world_size: int = 2):  # type: ignore[no-untyped-def]
        start_workers_safely(loader, "val_dataloader (DataLoader)", world_size)
        context = loader.multiprocessing_context
        return None if context is None else context.get_start_method()

    data = list(range(8))
    assert context_after(DataLoader(data, num_workers=2)) == "forkserver"
    assert context_after(StatefulDataLoader(data, num_workers=1)) == "forkserver"
    assert context_after(DataLoader(data, num_workers=2, multiprocessing_context="spawn")) == "spawn"  # the user's
    assert context_after(DataLoader(data, num_workers=2), world_size=1) is None  # one process: no group threads
    assert context_after(DataLoader(data, num_workers=0)) is None
    start_workers_safely(iter(data), "a loader that is no DataLoader", 2)  # left alone, no error


_PARENT = """
import os, sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset
from lightning_scale.data.forkserver import start_forkserver


class Squares(Dataset):  # of the script: workers find it as forked ones would
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor(float(index * index))


if __name__ == "__main__":
    if sys.argv[1] == "thread":
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    print("buffered before the server started")  # in the buffer as the server forks: printed once, not by workers
    server = start_forkserver()
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="forkserver")
    print(server, [batch.tolist() for batch in loader], flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("threads", ["one", "thread"])
def test_a_single_threaded_process_forks_its_forkserver_which_serves_at_once_and_ends_with_it(tmp_path, threads):
    """A warm-restart parent's forkserver is a fork of it (a few ms of CPU, not seconds of imports); a process with
    another thread running gets a new interpreter as usual. Either way the workers see the script's dataset, and the
    server and its workers go with a SIGKILLed parent."""
    marker = uuid.uuid4().hex
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    env = {**os.environ, "LIGHTNING_SCALE_TEST_MARK": marker}
    parent = subprocess.Popen([sys.executable, str(script), threads], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == "buffered before the server started\n"
        server, batches = parent.stdout.readline().split(" ", 1)
        assert batches == "[[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0]]\n"
        stat = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == parent.pid
        forked = b"forkserver" not in Path(f"/proc/{server}/cmdline").read_bytes()
        assert forked is (threads == "one")
        if forked:
            assert (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK") < 0.5  # CPU seconds: no import
    finally:
        parent.kill()
        rest = parent.communicate(timeout=60)[0]
    assert rest == ""
    deadline = time.monotonic() + 60
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked(marker) == []


_IMPORTS_ONCE = """
import sys
sys.path[:0] = {path!r}
import torch
from torch.utils.data import DataLoader, Dataset
import imports_seen  # beside the script: notes every process that imports it
from lightning_scale.data.forkserver import safe_worker_context

ARGV = sys.argv  # at import: the rank's arguments, in the server as in the rank


class Squares(Dataset):  # of the script: workers unpickle it from the script the server imported
    def __len__(self):
        return 8

    def __getitem__(self, index):
        assert ARGV[1:] == ["--rank-argument"], ARGV
        return torch.tensor(float(index * index))


if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    loader.multiprocessing_context = safe_worker_context(loader, "loader")
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    for epoch in range(3):  # workers start again at every epoch
        assert [batch.tolist() for batch in loader] == [[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0]]
"""


@pytest.mark.timeout(180)
def test_the_forkserver_imports_the_script_once_and_its_workers_start_without_importing_it(tmp_path):
    """multiprocessing's forkserver leaves the script to each worker (a run of its top level and of every import the
    server had not made, at every worker's start); the server imports it once, where the rank named it."""
    seen = tmp_path / "seen.txt"
    (tmp_path / "imports_seen.py").write_text(
        f"import os\nwith open({str(seen)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n"
    )
    script = tmp_path / "rank.py"
    script.write_text(_IMPORTS_ONCE.format(path=sys.path))
    command = [sys.executable, str(script), "--rank-argument"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    importers = seen.read_text().split()
    assert len(importers) == len(set(importers)) == 2, importers  # the script's process and the server, no worker
    assert "Traceback" not in done.stderr


_EARLY = """
import os, sys
import torch
from torch.utils.data import DataLoader, Dataset
from lightning_scale._python_internals import forkserver_pid
from lightning_scale.data.forkserver import safe_worker_context, start_forkserver_early


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor(float(index * index))


if __name__ == "__main__":
    launched = os.environ.pop(sys.argv[1])
    assert start_forkserver_early() is None  # a process alone: none
    os.environ[sys.argv[1]] = "1"
    assert start_forkserver_early() is None and forkserver_pid() is None
    os.environ[sys.argv[1]] = launched
    server = start_forkserver_early()  # as the command's rank does before it builds anything
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    loader.multiprocessing_context = safe_worker_context(loader, "loader")  # later, as a rank's loader
    batches = [batch.tolist() for batch in loader]
    print(server, forkserver_pid(), batches, flush=True)
    sys.stdin.readline()
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launched", ["WORLD_SIZE", "SLURM_STEP_NUM_TASKS"])
def test_a_rank_of_several_forks_its_forkserver_early_and_its_loader_s_workers_start_from_it(tmp_path, launched):
    """What the command does in a rank that torchrun or srun started (without warm restarts, whose parent does the
    same): the server its loaders' workers start from is a fork of the rank, made before the rank built anything (a
    few ms of CPU where a new interpreter spends seconds importing), used by the loader's forkserver context later,
    and gone with the rank. A process alone forks none (its loaders start a server as usual if they need one)."""
    marker = uuid.uuid4().hex
    script = tmp_path / "rank.py"
    script.write_text(_EARLY)
    env = {**os.environ, "LIGHTNING_SCALE_TEST_MARK": marker, "PYTHONPATH": os.pathsep.join(sys.path)}
    for variable in ("WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        env.pop(variable, None)
    env[launched] = "2"
    command = [sys.executable, str(script), launched]
    rank = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdin is not None
        early, server, batches = rank.stdout.readline().split(" ", 2)
        assert early == server and batches == "[[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0]]\n"
        stat = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == rank.pid
        assert b"forkserver" not in Path(f"/proc/{server}/cmdline").read_bytes()  # the rank's own command line
        assert (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK") < 0.5  # CPU seconds: no import
        rank.stdin.write("\n")
        rank.stdin.flush()
        assert rank.wait(timeout=60) == 0
    finally:
        rank.kill()
        rank.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked(marker) == []
