"""Starting training jobs as users start them: the ``torchrun`` command line, its environment, and one attempt of a
runner job watched to its end (or killed at its interruption point)."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from lightning_scale.testing.job import MARKER, read_job
from lightning_scale.testing.processes import job_environment, kill_process_tree

__all__ = ["RUNNER", "TORCHRUN", "launch_command", "launch_environment", "run_attempt", "torchrun_failures"]

RUNNER = "lightning_scale.testing.runner"  # python -m RUNNER CONFIG.json: one rank of a JobConfig's job
TORCHRUN = (
    "import gc, sys; gc.disable(); from torch.distributed.run import main; gc.freeze(); gc.enable(); sys.exit(main())"
)
"""``python -c TORCHRUN ARGS``: torchrun's own entry point, as its ``torchrun`` script runs it, with torch imported
and frozen the way lightning-scale imports it (:mod:`lightning_scale._collector`): ~0.4 s less CPU per agent than
``python -m torch.distributed.run``, with the same arguments, processes and behaviour."""


def launch_command(
    target: Sequence[str],
    processes: int,
    *,
    max_restarts: int | None = None,
    nodes: int | str = 1,
    rendezvous_endpoint: str | None = None,
    rendezvous_conf: str | None = None,
) -> list[str]:
    """torchrun (``python -c TORCHRUN ... TARGET``), or ``python TARGET`` for one process on one node.

    Args:
        target: What each process runs: ``["-m", "module", *args]`` or ``["script.py", *args]``.
        processes: Processes per node (``--nproc-per-node``).
        max_restarts: torchrun's ``--max-restarts`` (default: torchrun's own).
        nodes: torchrun agents of the job, or ``"MIN:MAX"`` for an elastic one; more than one needs
            ``rendezvous_endpoint``.
        rendezvous_endpoint: ``host:port`` of a c10d rendezvous shared by the agents (default: ``--standalone``).
        rendezvous_conf: torchrun's ``--rdzv-conf`` (e.g. ``"last_call_timeout=2"``).

    Examples:
        >>> launch_command(["-m", "my_job"], 2, max_restarts=1)[3:]  # doctest: +NORMALIZE_WHITESPACE
        ['--standalone', '--nproc-per-node=2', '--max-restarts=1', '-m', 'my_job']
    """
    if nodes not in (1, "1") and rendezvous_endpoint is None:
        raise ValueError(f"nodes={nodes} needs a rendezvous_endpoint ('host:port') that every agent reaches.")
    if processes == 1 and nodes == 1:
        return [sys.executable, *target]
    rendezvous = ["--standalone"]
    if rendezvous_endpoint is not None:
        rendezvous = [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous_endpoint}"]
        rendezvous.append("--rdzv-id=lightning-scale")
        if rendezvous_conf is not None:
            rendezvous.append(f"--rdzv-conf={rendezvous_conf}")
    restarts = [] if max_restarts is None else [f"--max-restarts={max_restarts}"]
    return [
        sys.executable,
        "-c",
        TORCHRUN,
        *rendezvous,
        f"--nproc-per-node={processes}",
        *restarts,
        *target,
    ]


def launch_environment(pythonpath: Iterable[str | Path], **extra: str) -> dict[str, str]:
    """This process's environment for a job: one thread per process (2 processes on a laptop's cores stay fast),
    ``pythonpath`` as ``PYTHONPATH``, and ``extra`` on top."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        **extra,
    }


def run_attempt(config_path: str | Path, timeout_s: float, expect: Literal["finish", "marker", "failure"]) -> int:
    """Run the runner job of ``config_path`` once (its output appended to ``log.txt`` beside it); its exit code.

    Args:
        config_path: The job file, written by :func:`~lightning_scale.testing.write_job`.
        timeout_s: Limit; a hang kills the job and fails.
        expect: ``finish``: it must exit 0; ``marker``: it is killed with SIGKILL (the whole process tree) once it
            wrote its interruption marker; ``failure``: it must exit non-zero.

    Raises:
        AssertionError: The job did not do what ``expect`` says, with the tail of its log.
    """
    config, out_dir = read_job(config_path), Path(config_path).parent
    marker = out_dir / MARKER
    marker.unlink(missing_ok=True)
    env = launch_environment(config.sys_path, **config.launch_env, **job_environment(out_dir))
    command = launch_command(["-m", RUNNER, str(config_path)], config.devices, max_restarts=config.max_restarts)
    with open(out_dir / "log.txt", "a") as log:
        log.write(f"\n===== attempt: {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            if _killed_at_marker(process, marker if expect == "marker" else None, timeout_s, out_dir):
                return process.wait()
        finally:
            if process.poll() is None:
                kill_process_tree(process.pid)
                process.wait()
    if expect == "failure":
        if process.returncode == 0:
            raise AssertionError(f"the job exited 0 although it should have stopped early{_tail(out_dir)}")
        return process.returncode
    if process.returncode != 0:
        raise AssertionError(f"attempt exited with code {process.returncode}{_tail(out_dir)}")
    if expect == "marker":
        raise AssertionError(f"the run finished without reaching its interruption point{_tail(out_dir)}")
    return 0


_TORCHRUN_EVENT = re.compile(
    r"^[EW](\d{4} \d\d:\d\d:\d\d\.\d+) .*(?:failed \(exitcode: (-?\d+)\)|closing signal)", re.MULTILINE
)


def torchrun_failures(log: str) -> list[tuple[datetime.datetime, int]]:
    """Per failed attempt in the log of a torchrun job of Lightning processes: when torchrun first reacted to a
    worker's end (it stops the others then; for a stopped process it reports the failure only after its 30 s SIGTERM
    wait), in local time, and the first exit code it reports. Attempts are told apart by rank 0's "Initializing
    distributed" line.

    Examples:
        >>> attempt = "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2\\n"
        >>> failed = "E1204 16:22:40.748000 14495 api.py:1002] failed (exitcode: 75) local_rank: 1 (pid: 14499)\\n"
        >>> [(when.strftime("%H:%M:%S"), code) for when, code in torchrun_failures(attempt + failed + attempt)]
        [('16:22:40', 75)]
    """
    year = datetime.datetime.now().year
    failures = []
    for attempt in log.split("Initializing distributed: GLOBAL_RANK: 0,")[1:]:
        events = _TORCHRUN_EVENT.findall(attempt)
        if events:
            when = datetime.datetime.strptime(f"{year}{events[0][0]}", "%Y%m%d %H:%M:%S.%f")
            failures.append((when, int(next(code for _, code in events if code))))
    return failures


def _killed_at_marker(process: subprocess.Popen, marker: Path | None, timeout_s: float, out_dir: Path) -> bool:
    """Wait for ``process``; True when ``marker`` appeared first and the job was killed."""
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        if marker is not None and marker.exists():
            kill_process_tree(process.pid)
            return True
        if time.monotonic() > deadline:
            raise AssertionError(f"attempt timed out after {timeout_s:.0f} s{_tail(out_dir)}")
        time.sleep(0.05)
    return False


def _tail(out_dir: Path, lines: int = 40) -> str:
    text = (out_dir / "log.txt").read_text(errors="replace").splitlines()
    dumps = [i for i, line in enumerate(text) if line.startswith("STACK DUMP:")]  # see runner._StackDumpIfStuck
    stacks = "\n".join(text[dumps[0] : dumps[0] + 300]) + "\n...\n" if dumps else ""
    return "; log tail:\n" + stacks + "\n".join(text[-lines:])
