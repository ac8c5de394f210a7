"""A usage error handed from one torchrun attempt to the next on the same node. torchrun restarts failed workers
whatever their exit code; an attempt after the first that finds the usage error left by an earlier one ends at once,
before it parses the command further, builds the model or joins a process group."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_scale._linux import process_start
from lightning_scale.errors import USAGE_ERROR_EXIT_CODE
from lightning_scale.restart.supervisor import LAUNCHER_PID_VARIABLE

__all__ = ["end_a_later_attempt", "launch_id", "remember_for_later_attempts", "usage_error_of_an_earlier_attempt"]


def launch_id() -> str | None:
    """What names this launch on this node, the same in each of its processes: torchrun's run id and agent process
    (the workers' parent, or their warm-restart parent's) with the attempt, or under Lightning's own launcher the
    process of local rank 0, which starts the others; ``None`` for a process alone (no ``LOCAL_RANK``)."""
    job = _torchrun_job()
    if job is not None:
        return f"{job}-{os.environ['TORCHELASTIC_RESTART_COUNT']}"
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None:
        return None
    return f"local-{_process_key(os.getpid() if local_rank == '0' else os.getppid())}"


def usage_error_of_an_earlier_attempt() -> str | None:
    """The usage error an earlier attempt of this torchrun job left on this node, if any."""
    marker = _attempt_marker()
    if marker is None or os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" or not marker.exists():
        return None
    return marker.read_text()


def remember_for_later_attempts(message: str) -> None:
    """Leave the usage error ``message`` for this torchrun job's next attempts on this node."""
    marker = _attempt_marker()
    if marker is not None:
        with contextlib.suppress(OSError):  # only a shortcut for the next attempts
            marker.write_text(message)


def end_a_later_attempt(earlier: str) -> NoReturn:
    """Exit on the usage error an earlier attempt of this torchrun job found. torchrun stops an attempt's other
    workers as soon as one exits, so rank 0's node-mates wait (5 s at most) until rank 0 has printed the report."""
    reported = Path(f"{_attempt_marker()}.reported-{os.environ.get('TORCHELASTIC_RESTART_COUNT')}")
    if rank_zero_only.rank == 0:  # type: ignore[attr-defined]
        print(f"lightning-scale: error: {earlier} (the same usage error stopped this torchrun job's first attempt)",
              file=sys.stderr, flush=True)  # fmt: skip
        with contextlib.suppress(OSError):  # only lets the other workers go
            reported.touch()
    elif os.environ.get("GROUP_RANK") == "0":
        deadline = time.monotonic() + 5.0
        while not reported.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    raise SystemExit(USAGE_ERROR_EXIT_CODE)


def _attempt_marker() -> Path | None:
    """Where a torchrun job's attempts leave a usage error for the next one on this node: named by the run id and
    the torchrun agent's process and its start, so a new torchrun command never reads an old one."""
    job = _torchrun_job()
    return None if job is None else Path(tempfile.gettempdir()) / f"lightning-scale-usage-error-{job}.txt"


def _torchrun_job() -> str | None:
    """``RUN_ID-AGENT`` of the torchrun job this worker belongs to (the agent: the workers' parent, or their
    warm-restart parent's), the same in every attempt; ``None`` outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or os.environ.get("TORCHELASTIC_RESTART_COUNT") is None:
        return None
    return f"{run_id}-{_process_key(int(os.environ.get(LAUNCHER_PID_VARIABLE, os.getppid())))}"


def _process_key(pid: int) -> str:
    """``PID.START``: the process ``pid`` and when it started, so that a later process given the same pid (pids are
    reused; torchrun's run id is ``none`` unless given) never reads what an earlier one left; the pid alone where the
    start is unknown (no ``/proc``)."""
    start = process_start(pid)
    return str(pid) if start is None else f"{pid}.{start}"
