"""Preemption cost on 2-process CPU DDP (torchrun, gloo), measured in one run.

1. Per-step overhead of SpotPreemption's flag vote (``check_every_n_steps=1``): fits without and with it alternate in
   the same two processes, the order swapped every round; each round's ratio of median step times is paired, and the
   verdict takes the upper quartile of those ratios (target <= 1.01; see ``_common.py``).
2. Seconds from a SIGTERM (sent to rank 1) to a durable checkpoint of a ~100 MB training state.

Prints a table and writes ``benchmarks/results/preemption_cost.json``.

    .venv/bin/python -m benchmarks.preemption_cost [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks._common import machine_info, meets, paired_ratios, spread
from benchmarks._summary import (
    Row,
    bound_text,
    md_ms,
    md_s,
    span_of,
    summary_row,
)
from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
TARGET_VOTE_RATIO = 1.01


def launch(part: str, steps: int, d_model: int, rounds: int = 1) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"preempt-bench-{part}-"))
    try:
        job = ["-m", "benchmarks._preemption_job", f"--part={part}", f"--steps={steps}"]
        job += [f"--d-model={d_model}", f"--rounds={rounds}", f"--workdir={workdir}"]
        command, env = launch_command(job, 2), launch_environment([ROOT])
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if part == "notice":
            metrics = next(workdir.glob("log/version_*/metrics.csv")).read_text().splitlines()
            key = "preemption/seconds_to_durable"
            seconds = [float(row[key]) for row in csv.DictReader(metrics) if row.get(key)]
            size = max(p.stat().st_size for p in (workdir / "ckpt").glob("*.ckpt")) / 1e6
            return {"notice_to_durable_s": seconds[0], "ckpt_mb": size}
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        return {"rounds": json.loads((workdir / "steps.json").read_text())}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps (smoke test)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "preemption_cost.json"))
    args = parser.parse_args()
    rounds, steps, d_model = (1, 20, 64) if args.quick else (9, 200, 416)

    per_round = launch("overhead", steps, 64, rounds)["rounds"]
    notices = [launch("notice", 40, d_model) for _ in range(1 if args.quick else 3)]

    ratio = paired_ratios([r["vote"] / r["none"] for r in per_round])
    holds = meets(ratio, TARGET_VOTE_RATIO)
    durable = spread([n["notice_to_durable_s"] for n in notices])
    print(f"preemption cost, 2 processes (gloo), {rounds} rounds of {steps} steps, order swapped every round")
    for variant in ("none", "vote"):
        s = spread([r[variant] for r in per_round])
        print(f"  ms/step {variant:<5} {s['median'] * 1e3:7.2f} ({s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f})")
    verdict = "holds" if holds else "MISSED"
    print(f"  vote/none, paired: median {ratio['median']:.3f}, upper quartile {ratio['upper_quartile']:.3f} "
          f"(target <= {TARGET_VOTE_RATIO} by the upper quartile: {verdict})")  # fmt: skip
    print(
        f"  SIGTERM -> durable checkpoint ({notices[0]['ckpt_mb']:.0f} MB): {durable['median']:.2f} s "
        f"({durable['min']:.2f}-{durable['max']:.2f}), {len(notices)} runs"
    )
    result = {
        "machine": machine_info(),
        "config": {"rounds": rounds, "steps": steps, "d_model": d_model, "quick": args.quick},
        "step_s": {v: spread([r[v] for r in per_round]) for v in ("none", "vote")},
        "per_round": per_round,
        "vote_over_none": ratio,
        "target": TARGET_VOTE_RATIO,
        "holds": holds,
        "notice_to_durable_s": durable,
        "ckpt_mb": notices[0]["ckpt_mb"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    durable = result["notice_to_durable_s"]
    return [
        summary_row("preemption_cost",
            f"SIGTERM to rank 1 → durable checkpoint, {result['ckpt_mb']:.0f} MB (2 processes)",
            durable["median"], span_of(durable), "s"),
        summary_row("preemption_cost", "step time, SpotPreemption voting every step / none (2 processes)",
            result["vote_over_none"]["median"], span_of(result["vote_over_none"]), "x",
            bound_text(result["vote_over_none"], result["target"]), result["holds"]),
    ]  # fmt: skip


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    steps = result["step_s"]
    durable = result["notice_to_durable_s"]
    return (
        f"ms per step without / with the vote: {md_ms(steps['none'])} / {md_ms(steps['vote'])}; SIGTERM to a durable "
        f"checkpoint of {result['ckpt_mb']:.0f} MB: {md_s(durable)} s."
    )


if __name__ == "__main__":
    main()
