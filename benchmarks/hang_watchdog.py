"""HangWatchdog on 2-process CPU DDP (torchrun, gloo): what it costs per step, and how fast a frozen rank becomes a
resumed job.

1. Step time with ``HangWatchdog`` (and with ``StragglerDetector`` as well) over none: the variants alternate in the
   same processes, their order rotated every round; each round gives one paired ratio per variant. The verdict uses
   the **upper quartile** of the paired ratios (target <= 1.01), never their median. As a breakdown, the watchdog's
   own work per step (its two marks) is timed in this process.
2. Detection latency, for the example's ~100 MB training state: rank 1 freezes (SIGSTOP) mid-epoch; the times from the
   freeze to the watchdog's exit (its allowance: ``min_timeout_s``), to torchrun's restart (torchrun waits 30 s for a
   stopped process to take its SIGTERM, then kills it), to the restarted job's first step. ``--quick`` hangs rank 1
   in Python instead, which takes SIGTERM at once.

Prints a table and writes ``benchmarks/results/hang_watchdog.json``.

    .venv/bin/python -m benchmarks.hang_watchdog [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info, meets, paired_ratios, spread
from benchmarks._summary import (
    Row,
    md_ms,
    span_of,
    summary_row,
)
from lightning_scale.health import HANG_EXIT_CODE
from lightning_scale.testing import launch_command, launch_environment, torchrun_failures

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.01


def _launch(workdir: Path, *arguments: str, max_restarts: int | None = None) -> str:
    job = ["-m", "benchmarks._hang_watchdog_job", f"--workdir={workdir}", *arguments]
    command = launch_command(job, 2, max_restarts=max_restarts)
    env = launch_environment([ROOT], TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")  # stock ddp's restarts need it
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    return done.stdout + done.stderr


def marks_us_per_step(steps: int = 20000) -> float:
    """The watchdog's own work per training step, in this process: its two marks (hooks called directly)."""
    from types import SimpleNamespace

    from lightning_scale.callbacks import HangWatchdog
    from lightning_scale.health import HANG_EXIT_CODE, ProgressWatchdog

    watchdog = HangWatchdog()
    watchdog._watchdog = ProgressWatchdog(HANG_EXIT_CODE, advice="")  # what setup() arms, without a Trainer
    trainer: Any = SimpleNamespace(global_step=5, current_epoch=0)
    started = time.perf_counter()
    for batch in range(steps):
        watchdog.on_train_batch_start(trainer, None, None, batch)  # type: ignore[arg-type]
        watchdog.on_train_batch_end(trainer, None, None, None, batch)  # type: ignore[arg-type]
    watchdog._watchdog.close()
    return (time.perf_counter() - started) / steps * 1e6


def detection(workdir: Path, steps: int, d_model: int, freeze: str, min_timeout_s: float) -> dict[str, float]:
    log = _launch(workdir, "--part=detection", f"--steps={steps}", f"--d-model={d_model}", f"--freeze={freeze}",
                  f"--min-timeout-s={min_timeout_s}", max_restarts=1)  # fmt: skip
    frozen = (workdir / "fault0_rank1.happened").stat().st_mtime
    [(when, code)] = torchrun_failures(log)  # the frozen attempt's; the restarted one finished
    if code != HANG_EXIT_CODE:
        raise RuntimeError(f"the frozen attempt ended with exit code {code}, not the watchdog's {HANG_EXIT_CODE}")
    exited = when.timestamp()
    restarted = json.loads((workdir / "detection.json").read_text())
    return {
        "freeze_to_exit_s": exited - frozen,
        "exit_to_restart_s": restarted["process_started"] - exited,
        "restart_to_first_step_s": restarted["first_step_ended"] - restarted["process_started"],
        "freeze_to_first_step_s": restarted["first_step_ended"] - frozen,
        "ckpt_mb": max(p.stat().st_size for p in (workdir / "ckpt").rglob("*") if p.is_file()) / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds and steps, a Python hang (smoke test)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hang_watchdog.json"))
    args = parser.parse_args()
    rounds, steps, d_model, state_d_model = (1, 20, 64, 64) if args.quick else (9, 150, 64, 416)
    freeze, min_timeout_s = ("hang", 2.0) if args.quick else ("SIGSTOP", 10.0)

    scratch = Path(tempfile.mkdtemp(prefix="hang-bench-"))
    try:
        (scratch / "overhead").mkdir()
        _launch(scratch / "overhead", "--part=overhead", f"--steps={steps}", f"--d-model={d_model}",
                f"--rounds={rounds}")  # fmt: skip
        per_round = json.loads((scratch / "overhead" / "overhead.json").read_text())
        (scratch / "detection").mkdir()
        latency = detection(scratch / "detection", 40, state_d_model, freeze, min_timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    ratios = {
        variant: paired_ratios([entry[variant] / entry["none"] for entry in per_round])
        for variant in ("watchdog", "watchdog+stragglers")
    }
    own_us = marks_us_per_step()
    holds = {variant: meets(ratio, TARGET) for variant, ratio in ratios.items()}
    print(f"HangWatchdog, 2 processes (gloo), {rounds} rounds of {steps} steps, variants rotated")
    for variant in ("none", "watchdog", "watchdog+stragglers"):
        s = spread([entry[variant] for entry in per_round])
        print(f"  ms/step {variant:<20} {s['median'] * 1e3:7.2f} ({s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f})")
    for variant, ratio in ratios.items():
        verdict = "holds" if holds[variant] else "MISSED"
        print(
            f"  {variant} / none, paired: median {ratio['median']:.3f}, upper quartile {ratio['upper_quartile']:.3f}"
            f" ({ratio['min']:.3f}-{ratio['max']:.3f}; target <= {TARGET} by the upper quartile: {verdict})"
        )
    print(
        f"  {freeze} of rank 1 ({latency['ckpt_mb']:.0f} MB checkpoint, min_timeout_s={min_timeout_s:g}): exit after "
        f"{latency['freeze_to_exit_s']:.1f} s, restarted after {latency['exit_to_restart_s']:.1f} s more, first "
        f"step {latency['restart_to_first_step_s']:.1f} s later: {latency['freeze_to_first_step_s']:.1f} s in all"
    )
    config = {"rounds": rounds, "steps": steps, "d_model": d_model, "state_d_model": state_d_model, "freeze": freeze,
              "min_timeout_s": min_timeout_s, "quick": args.quick}  # fmt: skip
    result = {
        "machine": machine_info(),
        "config": config,
        "step_s": {v: spread([entry[v] for entry in per_round]) for v in ("none", "watchdog", "watchdog+stragglers")},
        "per_round": per_round,
        "over_none": ratios,
        "marks_us_per_step": own_us,
        "target": TARGET,
        "holds": holds,
        "detection": latency,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    rows = []
    for variant, label in (("watchdog", "HangWatchdog"), ("watchdog+stragglers", "HangWatchdog + StragglerDetector")):
        ratio = result["over_none"][variant]
        own = f", the watchdog's own marks {result['marks_us_per_step']:.0f} µs/step" if variant == "watchdog" else ""
        rows.append(summary_row("hang_watchdog", f"step time, {label} / none (paired per round, 2 processes{own})",
                        ratio["median"], span_of(ratio), "x", f"≤ {result['target']} (upper quartile "
                        f"{ratio['upper_quartile']:.3f})", result["holds"][variant]))  # fmt: skip
    latency, config = result["detection"], result["config"]
    rows.append(summary_row("hang_watchdog", f"{config['freeze']} of rank 1 → restarted job's first step, "
                    f"{latency['ckpt_mb']:.0f} MB state, min_timeout_s={config['min_timeout_s']:g} (exit after "
                    f"{latency['freeze_to_exit_s']:.1f} s, torchrun restart {latency['exit_to_restart_s']:.1f} s, "
                    f"first step {latency['restart_to_first_step_s']:.1f} s)", latency["freeze_to_first_step_s"],
                    None, "s"))  # fmt: skip
    return rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    steps = result["step_s"]
    return "ms per step: " + ", ".join(f"{variant} {md_ms(spread)}" for variant, spread in steps.items()) + "."


if __name__ == "__main__":
    main()
