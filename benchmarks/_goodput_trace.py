"""The fault trace of benchmarks/goodput.py and the driver that injects it into a running job
(:class:`~_goodput_cluster.Cluster`).

The trace, the same for every variant: the kinds in turn (SIGKILL of a rank's training process, SIGTERM to the process
torchrun started for a rank, SIGSTOP of a rank's training process, node ``b`` lost), each rank from a seeded
generator. A fault is injected ``interval_s`` after the job's first step, each next one ``interval_s`` after the
previous one, or once the job trains again, if later. What the world would do where a job does not act by itself:

- a frozen or notified process still there ``interval_s`` (at least 5 s) after its fault, the job not trained again,
  is SIGKILLed: an operator's kill, the notified machine reclaimed (30 s after a GCP notice, 2 minutes after an AWS
  one);
- a job that cannot finish (a node's workers exited 0 before the last step: stock Lightning's ``SIGTERMException``
  is a ``SystemExit``, which torchrun takes for success) is stopped and submitted again at once, on the same nodes
  (an orchestrator's or a person's resubmission; torchrun alone would wait 300 s in its exit barrier, then end).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from typing import Any

from benchmarks._goodput_cluster import Cluster

KINDS = ("SIGKILL", "SIGTERM", "SIGSTOP", "node")
MIN_ALLOWANCE_S = 5.0  # a frozen or notified process is SIGKILLed this long after its fault at the soonest


def trace(faults: int, seed: int) -> list[dict[str, Any]]:
    """``faults`` faults, the kinds in turn, each rank from a generator seeded with ``seed`` (a lost node: ``b``)."""
    rng = random.Random(seed)
    out = []
    for index in range(faults):
        kind = KINDS[index % len(KINDS)]
        out.append({"kind": kind, "rank": None if kind == "node" else rng.choice((0, 1))})
    return out


def drive(cluster: Cluster, faults: list[dict[str, Any]], interval_s: float, steps: int, deadline: float,
          name: str) -> list[dict[str, Any]]:  # fmt: skip
    """Inject ``faults`` into the running ``cluster`` (see the module's description) and wait for the job's end;
    the faults injected, with when and into what."""
    while not any(r["event"] == "step" for r in cluster.records()):
        if cluster.finished() or time.time() > deadline:
            raise RuntimeError(f"{name}: no training step; the nodes' last output:\n{cluster.log_tails()}")
        time.sleep(0.05)
    due = min(r["t"] for r in cluster.records() if r["event"] == "step") + interval_s
    injected: list[dict[str, Any]] = []
    for fault in faults:
        if not _wait(cluster, injected[-1] if injected else None, due, interval_s, steps, deadline):
            break
        injected.append({**fault, **cluster.inject(fault["kind"], fault["rank"])})
        print(f"  {name}: {fault['kind']} at {injected[-1]['t'] - cluster.launched:.1f} s", flush=True)
        due = injected[-1]["t"] + interval_s
    _wait(cluster, injected[-1] if injected else None, float("inf"), interval_s, steps, deadline)
    return injected


def _wait(cluster: Cluster, previous: dict[str, Any] | None, due: float, interval_s: float, steps: int,
          deadline: float) -> bool:  # fmt: skip
    """Until ``due`` and the job trains again after ``previous``: True; False when the job finished first."""
    while time.time() < due or not _recovered(cluster, previous):
        if cluster.finished():
            return False
        if time.time() > deadline:
            raise RuntimeError(f"the job did not recover from {previous} in time; see {cluster.workdir}")
        if cluster.ended_early(steps) and previous is not None:
            previous.setdefault("resubmitted", time.time())
            cluster.resubmit()
        _end_if_stuck(cluster, previous, interval_s)
        time.sleep(0.05)
    return True


def _recovered(cluster: Cluster, fault: dict[str, Any] | None) -> bool:
    """Whether every rank trained a step in an attempt started after ``fault``."""
    if fault is None:
        return True
    ranks = {r["rank"] for r in cluster.records() if r["event"] == "step" and r["attempt"] > fault["t"]}
    return ranks == {0, 1}


def _end_if_stuck(cluster: Cluster, fault: dict[str, Any] | None, interval_s: float) -> None:
    """A frozen or notified process still there after its allowance, the job not trained again: SIGKILL."""
    if fault is None or fault["kind"] not in ("SIGSTOP", "SIGTERM") or "ended_by_driver" in fault:
        return
    allowance_s = max(interval_s, MIN_ALLOWANCE_S)
    if time.time() >= fault["t"] + allowance_s and not _recovered(cluster, fault):
        fault["ended_by_driver"] = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(fault["pid"], signal.SIGKILL)
            fault["ended_by_driver"] = time.time()
