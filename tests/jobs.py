"""Run a test job module (``python -m MODULE CONFIG.json``) on 1 process or under torchrun, and read its results.

A launch costs ~7 s on 2 cores before any training (torchrun, and Lightning's import on every rank), so runs that
need the same processes can share one launch: ``run_json_jobs`` asks the job for several runs one after another,
each with its own output folder, in one process group."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
RUN_MARKER = "[tests.jobs] run "


def run_json_job(module: str, out: Path, config: dict, devices: int, expect_failure: bool = False) -> dict:
    """Write ``config`` (plus ``out``) to ``out/config.json``, run ``module`` on it, return ``result.json`` with the
    ``weights.pt`` it wrote and the log; with ``expect_failure``, only the log of a run that must fail."""
    log = _launch(module, out, {"out": str(out), **config}, devices, expect_failure)
    return {"log": log} if expect_failure else _read(out, log)


def run_json_jobs(module: str, out: Path, configs: dict[str, dict], devices: int) -> dict[str, dict]:
    """``run_json_job`` for several configs in one launch: ``{name: result}``, each run's output in ``out/name``."""
    runs = {name: {**config, "out": str(out / name)} for name, config in configs.items()}
    log = _launch(module, out, {"out": str(out), "runs": runs}, devices, expect_failure=False)
    return {name: _read(out / name, _run_log(log, name)) for name in configs}


def job_configs(config_path: str) -> Iterator[dict]:
    """For a job module: the run(s) its config file asks for, in order, with their output folders created; each
    run's log starts with a marker line, so that every run's result holds its own part of the launch's log."""
    config = json.loads(Path(config_path).read_text())
    for name, run in config["runs"].items() if "runs" in config else [("", config)]:
        Path(run["out"]).mkdir(parents=True, exist_ok=True)
        # one write (print writes the text and its newline apart, and another rank's line can land between them)
        sys.stdout.write(f"{RUN_MARKER}{name}\n")
        sys.stdout.flush()
        yield run


def _run_log(log: str, name: str) -> str:
    """The part of a shared launch's log from the run's first marker to the next run's first marker."""
    start = log.index(f"{RUN_MARKER}{name}\n")
    following = [log.find(RUN_MARKER, start + 1)]
    while following[-1] != -1 and log.startswith(f"{RUN_MARKER}{name}\n", following[-1]):  # the other ranks' markers
        following.append(log.find(RUN_MARKER, following[-1] + 1))
    return log[start:] if following[-1] == -1 else log[start : following[-1]]


def _launch(module: str, out: Path, config: dict, devices: int, expect_failure: bool) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    command = launch_command(["-m", module, str(out / "config.json")], devices)
    env = launch_environment(
        [ROOT],
        PYTHONFAULTHANDLER="1",  # a crash shows where
        PYTHONUNBUFFERED="1",  # the log in the order things happened: each run's part follows its marker
    )
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if expect_failure:
        assert done.returncode != 0
    else:
        assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


def _read(out: Path, log: str) -> dict:
    result = json.loads((out / "result.json").read_text())
    result["weights"] = torch.load(out / "weights.pt", weights_only=True)
    result["log"] = log
    return result
