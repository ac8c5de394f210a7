"""Two simulated nodes for benchmarks/goodput.py: one torchrun agent each on 127.0.0.1 (c10d rendezvous, one process
per node), each with its own node memory (``LIGHTNING_SCALE_SNAPSHOT_DIR``), every output line stamped with the wall
time it arrived; and the faults the driver injects into them.

Rendezvous settings (``RENDEZVOUS_CONF``): node ``a`` hosts the c10d store (``is_host=1``; the README's "the
rendezvous host must stay": a lost node is always ``b``); ``last_call_timeout=1`` completes a round 1 s after the
last node joins instead of 30 s; a keep-alive every second, 3 missed = dead (torchrun's default 5 s x 3), so that a
lost node's place in the rendezvous is freed for its replacement within seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._goodput_analysis import steps_reached
from lightning_scale.testing import kill_process_tree
from lightning_scale.testing.processes import descendants

ROOT = Path(__file__).resolve().parents[1]
RENDEZVOUS_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
MAX_RESTARTS = 100


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Node:
    """One torchrun agent and everything below it; its output lines as ``(wall time, line)``."""

    name: str
    command: list[str]
    env: dict[str, str]
    workdir: Path
    memory: Path
    lines: list[tuple[float, str]] = field(default_factory=list)
    process: subprocess.Popen | None = None

    def start(self) -> None:
        self.memory.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "LIGHTNING_SCALE_SNAPSHOT_DIR": str(self.memory)}
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                        cwd=self.workdir)  # fmt: skip
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        with open(self.workdir / f"node_{self.name}.txt", "a") as log:
            for raw in process.stdout:
                stamp, line = time.time(), raw.decode(errors="replace").rstrip("\n")
                self.lines.append((stamp, line))
                log.write(f"{stamp:.3f} {line}\n")

    def lose(self) -> None:
        """The machine is gone: the agent and every process below it at once, and its memory."""
        assert self.process is not None
        kill_process_tree(self.process.pid)
        self.process.wait()
        shutil.rmtree(self.memory, ignore_errors=True)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def holds(self, pid: int) -> bool:
        return self.process is not None and pid in descendants(self.process.pid)

    def worker_of(self, pid: int) -> int:
        """The process torchrun started whose tree holds ``pid`` (a warm-restart parent, or ``pid`` itself)."""
        assert self.process is not None
        while (parent := _parent(pid)) != self.process.pid:
            pid = parent
        return pid

    def stop(self) -> None:
        if self.running():
            assert self.process is not None
            kill_process_tree(self.process.pid)
            self.process.wait()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def torchrun(port: int, hosts_rendezvous: bool, target: list[str]) -> list[str]:
    """The agent command of one node: 2 nodes, 1 process each, c10d rendezvous on 127.0.0.1:``port``."""
    conf = f"is_host={int(hosts_rendezvous)},{RENDEZVOUS_CONF}"
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=goodput", f"--rdzv-conf={conf}",
        f"--max-restarts={MAX_RESTARTS}", *target,
    ]  # fmt: skip


class Cluster:
    """Nodes ``a`` (the rendezvous host) and ``b`` running one job; its records; the faults.

    Args:
        target: What each agent runs (``["-m", "lightning_scale", "fit", ...]`` or ``["script.py", ...]``).
        env: The agents' environment.
        workdir: The job's folder (records, logs); node memories go under ``memory``.
    """

    def __init__(self, target: list[str], env: dict[str, str], workdir: Path, memory: Path) -> None:
        self.target, self.workdir = target, workdir
        self.nodes = {name: Node(name, [], env, workdir, memory / name) for name in ("a", "b")}
        self.launched = self.submitted = 0.0

    def start(self) -> None:
        """Submit the job: both agents, on a rendezvous of their own."""
        port = free_port()
        self.submitted = time.time()
        self.launched = self.launched or self.submitted
        for name, node in self.nodes.items():
            node.command = torchrun(port, name == "a", self.target)
            node.start()

    def resubmit(self) -> None:
        """Stop what is left of the job and submit it again on the same nodes, as an orchestrator would."""
        self.stop()
        self.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def finished(self) -> bool:
        return not any(node.running() for node in self.nodes.values())

    def exit_codes(self) -> dict[str, int | None]:
        return {name: node.process.poll() if node.process else None for name, node in self.nodes.items()}

    def lines(self) -> list[tuple[float, str, str]]:
        """Every node's output lines so far as ``(wall time, node, line)``, in time order."""
        merged = [(stamp, name, line) for name, node in self.nodes.items() for stamp, line in list(node.lines)]
        return sorted(merged)

    def ended_early(self, steps: int) -> bool:
        """Whether, since it was submitted, a node's workers all exited 0 before the job's last step: it cannot
        finish (that agent waits in its 300 s exit barrier, the other one cannot form a rendezvous without it)."""
        lines = self.lines()
        done = any(s > self.submitted and "worker group successfully finished" in line for s, _, line in lines)
        return done and steps_reached(self.records()) < steps

    def records(self) -> list[dict[str, Any]]:
        """Every rank's records so far (``StepRecords``), each with its ``rank``, in time order."""
        found = []
        for path in self.workdir.glob("records_rank*.jsonl"):
            rank = int(path.stem.removeprefix("records_rank"))
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line being written when its process died
                    found.append({**json.loads(line), "rank": rank})
        return sorted(found, key=lambda r: r["t"])

    def training_pid(self, rank: int) -> int | None:
        """The process running rank ``rank``'s training now (its latest attempt's), if it is alive."""
        setups = [r for r in self.records() if r["event"] == "setup" and r["rank"] == rank]
        pid = setups[-1]["pid"] if setups else None
        return pid if pid is not None and any(node.holds(pid) for node in self.nodes.values()) else None

    def log_tails(self, lines: int = 20) -> str:
        """Each node's last ``lines`` of output: a failure is reported with them (a scratch workdir is removed)."""
        parts = []
        for name in self.nodes:
            path = self.workdir / f"node_{name}.txt"
            tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no output)"]
            parts.append("\n".join([f"--- node {name} ---", *tail]))
        return "\n".join(parts)

    def node_of(self, pid: int) -> Node:
        return next(node for node in self.nodes.values() if node.holds(pid))

    def inject(self, kind: str, rank: int) -> dict[str, Any]:
        """One fault; what was done, and when."""
        if kind == "node":
            node = self.nodes["b"]
            lost = [r for r in (0, 1) if (pid := self.training_pid(r)) is not None and node.holds(pid)]
            when = time.time()
            node.lose()
            node.start()  # a replacement joins at once
            return {"t": when, "target": "node b (agent, workers, memory)", "ranks_lost": lost}
        pid = self.training_pid(rank)
        if pid is None:
            raise RuntimeError(f"rank {rank} has no training process to {kind}")
        target = self.node_of(pid).worker_of(pid) if kind == "SIGTERM" else pid
        when = time.time()
        os.kill(target, {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGSTOP": signal.SIGSTOP}[kind])
        return {"t": when, "pid": target, "target": f"rank {rank}'s {'worker' if kind == 'SIGTERM' else 'training'} "
                f"process"}  # fmt: skip
