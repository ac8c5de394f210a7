"""A hung rank has the stopped processes of its own torchrun worker group killed once it has exited, and nothing else:
real processes, this test standing in for the torchrun agent (their parent)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_scale._linux import process_state

ROOT = Path(__file__).resolve().parents[2]
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
REPORT = """
import json, os, time
from lightning_scale._linux import process_state
from lightning_scale.health import kill_stopped_peers_after_exit, stopped_peers
group = {name: os.environ.pop(name) for name in ("TORCHELASTIC_RUN_ID", "GROUP_RANK")}
outside = stopped_peers()  # the same siblings, seen from a process that torchrun did not start
os.environ.update(group)
peers = kill_stopped_peers_after_exit(grace_s=0.2)
time.sleep(1.0)
print(json.dumps({"outside": outside, "peers": peers, "while_alive": [process_state(pid) for pid in peers]}))
"""


def _started(env: dict[str, str], stop: bool) -> subprocess.Popen:
    process = subprocess.Popen(SLEEP, env={**os.environ, **env})
    if stop:
        os.kill(process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while process_state(process.pid) != "T":
            assert time.monotonic() < deadline, process_state(process.pid)
            time.sleep(0.01)
    return process


@pytest.mark.timeout(120)
def test_only_the_stopped_processes_of_the_same_job_and_node_are_killed_after_the_rank_exits():
    group = {"TORCHELASTIC_RUN_ID": "job-a", "GROUP_RANK": "0"}
    processes = {
        "stopped peer": _started(group, stop=True),
        "running peer": _started(group, stop=False),
        "stopped, another job": _started({**group, "TORCHELASTIC_RUN_ID": "job-b"}, stop=True),
        "stopped, another node's group": _started({**group, "GROUP_RANK": "1"}, stop=True),
        "stopped, no torchrun": _started({}, stop=True),
    }
    try:
        done = subprocess.run([sys.executable, "-c", REPORT], env={**os.environ, **group}, cwd=ROOT,
                              capture_output=True, text=True, timeout=90)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.splitlines()[-1])
        # left stopped while the rank lived (torchrun must see the rank's own exit first), killed after it ended
        assert report == {"outside": [], "peers": [processes["stopped peer"].pid], "while_alive": ["T"]}
        assert processes["stopped peer"].wait(timeout=30) == -signal.SIGKILL
        states = {name: process_state(p.pid) for name, p in processes.items() if name != "stopped peer"}
        assert states == {"running peer": "S", "stopped, another job": "T", "stopped, another node's group": "T",
                          "stopped, no torchrun": "T"}  # fmt: skip
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
