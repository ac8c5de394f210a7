"""What a run of benchmarks/goodput.py measured, from its records (``StepRecords``: per rank, every attempt's set-up,
restored step and step ends), its output lines (stamped on arrival) and the driver's fault times.

Per fault, on the wall clock: **detection** (the fault → the first output line that shows the failure being acted on:
a warm restart announced, torchrun stopping or restarting workers, a notice taken), **restart** (→ the training start
of the attempt that resumed: the last rank's ``setup``, its process group up), **state load** (→ the end of that
attempt's first step, on the last rank; in parts: ``read_s`` the checkpoint or snapshot read and loaded into the
model, ``prepare_s`` the model wrapped, the optimizer's state restored and the loader's worker started, ``step_s``
the first step), and **steps replayed** (the furthest step any earlier attempt reached minus the step resumed from).
"""

from __future__ import annotations

import re
from statistics import median
from typing import Any

ACTED_ON = re.compile(
    r"Restarting every rank's training from its parent|no warm restart|for torchrun to restart|"
    r"failed \(exitcode|closing signal|Worker group FAILED|Detected \d+ new nodes|Received SIGTERM|"
    r"Preemption notice from"
)
"""Output lines that show a failure being acted on: a warm restart, torchrun stopping or restarting workers, a
preemption notice taken."""

_MEMORY = re.compile(r"memory snapshot of step (\d+)")
_DURABLE = re.compile(r"Auto-resuming from |Restoring states from the checkpoint")


def steps_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "step"]


def step_end(records: list[dict[str, Any]], step: int) -> float | None:
    """When the job finished optimizer step ``step`` (its last rank, in the attempt that counted: the latest)."""
    ends: dict[int, float] = {}
    for r in steps_of(records):
        if r["step"] == step:
            ends[r["rank"]] = r["t"]  # a replayed step: the later time counts
    return max(ends.values()) if ends else None


def steps_reached(records: list[dict[str, Any]]) -> int:
    """The step the job's latest attempt reached (on every rank)."""
    latest = max((r["attempt"] for r in records if r["rank"] == 0), default=None)
    reached = [r["step"] for r in steps_of(records) if r["rank"] == 0 and r["attempt"] == latest]
    return max(reached, default=0)


def fault_breakdown(fault: dict[str, Any], records: list[dict[str, Any]], lines: list[tuple[float, str, str]],
                    launched: float) -> dict[str, Any]:  # fmt: skip
    """The measures of one fault (see the module's description), in seconds from the fault."""
    t = fault["t"]
    out: dict[str, Any] = {key: fault.get(key) for key in ("kind", "rank", "target", "ranks_lost")}
    out["at_s"] = t - launched
    if fault.get("ended_by_driver") is not None:
        out["ended_by_driver_s"] = fault["ended_by_driver"] - t
    if fault.get("resubmitted") is not None:
        out["resubmitted_s"] = fault["resubmitted"] - t
    acted = next(((stamp, line) for stamp, _, line in lines if stamp > t and ACTED_ON.search(line)), None)
    firsts = {}
    for rank in sorted({r["rank"] for r in records}):
        firsts[rank] = next((r for r in steps_of(records) if r["rank"] == rank and r["attempt"] > t), None)
    if not firsts or any(first is None for first in firsts.values()):
        return {**out, "recovered": False}
    started = max(first["attempt"] for first in firsts.values())
    first_step = max(first["t"] for first in firsts.values())
    attempts = {rank: first["attempt"] for rank, first in firsts.items()}
    restored = _latest(records, attempts, "train_start")
    loaded = _latest(records, attempts, "loaded") or started
    rank0 = [r for r in records if r["rank"] == 0]
    resumed = next(r["step"] for r in rank0 if r["event"] == "train_start" and r["attempt"] == attempts[0])
    reached = max((r["step"] for r in steps_of(records) if r["attempt"] < t), default=0)
    detected = acted[0] if acted is not None else started
    restarts = {r["attempt"] for r in rank0 if r["event"] == "setup" and t < r["attempt"] <= attempts[0]}
    return {
        **out,
        "recovered": True,
        "detection_s": detected - t,
        "acted_on": acted[1][:200] if acted is not None else None,
        "restart_s": started - detected,
        "load_s": first_step - started,
        "read_s": loaded - started,
        "prepare_s": restored - loaded,
        "step_s": first_step - restored,
        "first_resumed_step_s": first_step - t,
        "resumed_from_step": resumed,
        "reached_step": reached,
        "steps_replayed": reached - resumed,
        "attempts": len(restarts),
        "resumed_from": _source(lines, t, first_step),
    }


def _latest(records: list[dict[str, Any]], attempts: dict[int, float], event: str) -> float | None:
    """When the last rank reached ``event`` in its attempt of ``attempts`` (``None``: no rank did)."""
    return max((r["t"] for r in records if r["event"] == event and r["attempt"] == attempts[r["rank"]]), default=None)


def _source(lines: list[tuple[float, str, str]], since: float, until: float) -> str:
    """Where the resumed attempt's state came from, by its resume banner (a memory snapshot's wins: Lightning names
    the file it reads either way)."""
    window = [line for stamp, _, line in lines if since < stamp <= until]
    if any(_MEMORY.search(line) for line in window):
        return "memory"
    return "durable" if any(_DURABLE.search(line) for line in window) else "start (no checkpoint)"


def goodput(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Goodput two ways, both the uninterrupted time for the steps ``run`` reached over ``run``'s wall time (launch to
    the end of that step):

    - ``goodput``: the uninterrupted time as the run's own timeline gives it: its first attempt's start (launch to the
      end of its first step) plus every step that counted at this run's own step time (a step that followed another
      in the same attempt: as it was measured; an attempt's first step: the run's median step). Only the time that
      faults cost is lost: the restart gaps and the steps trained again;
    - ``goodput_vs_reference``: the uninterrupted time measured by ``reference``, a run of its own launched minutes
      away (stock Lightning's): it also counts the difference of step times between the two jobs, which on a shared
      machine moves by tens of percent between runs minutes apart.
    """
    records = run["records"]
    reached = steps_reached(records)
    end, uninterrupted = step_end(records, reached), step_end(reference["records"], reached)
    if end is None:
        return {"goodput": 0.0, "goodput_vs_reference": 0.0, "steps": reached, "wall_s": None}
    wall = end - run["launched"]
    return {
        "goodput": _own_uninterrupted_s(records, run["launched"], reached) / wall,
        "goodput_vs_reference": 0.0 if uninterrupted is None else (uninterrupted - reference["launched"]) / wall,
        "steps": reached,
        "wall_s": wall,
    }


def _own_uninterrupted_s(records: list[dict[str, Any]], launched: float, reached: int) -> float:
    """What ``records``' job would have taken for steps 1 to ``reached`` without a fault (see :func:`goodput`)."""
    counted: dict[int, tuple[float, float]] = {}  # step -> (attempt, end) on rank 0: the latest run of a step counts
    for r in steps_of(records):
        if r["rank"] == 0 and r["step"] <= reached:
            counted[r["step"]] = (r["attempt"], r["t"])
    durations = [
        end - counted[step - 1][1]
        for step, (attempt, end) in counted.items()
        if step - 1 in counted and counted[step - 1][0] == attempt
    ]
    typical = median(durations)
    first_attempt = (counted[1][1] - launched) if 1 in counted else typical
    resumed = sum(
        1 for step, (attempt, _) in counted.items() if step > 1 and counted.get(step - 1, (0.0, 0.0))[0] != attempt
    )
    return first_attempt + sum(durations) + resumed * typical
