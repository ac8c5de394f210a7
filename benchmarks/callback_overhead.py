"""Per-step cost of the callbacks ``lightning-scale fit`` runs against the stock callbacks users would otherwise run.

The example transformer on 1 process and on 2 (torchrun, stock ``ddp``, gloo; 1 thread each), at the example's width
(a step of a few ms) and at a width whose step takes 20 ms or more. ``ours``: the command's default callbacks
(``ResumableCheckpoint`` with its memory snapshots and an ``every_n_minutes`` timer, ``SpotPreemption``,
``CostTracker``, ``HangWatchdog``, ``StragglerDetector``) and ``BudgetedEarlyStopping`` (a cost budget), whose votes
share one all-reduce that no step waits for; ``stock``: ``ModelCheckpoint`` and ``EarlyStopping`` (see
``_callback_job.py``). No save falls inside the timed steps.

Method (as every benchmark here, see ``_common.py``): both variants alternate in the same processes, the order swapped
every round; a step is the median interval between the ends of consecutive training batches after a warm-up; each
round gives one paired ratio ours / stock, and the verdict takes the upper quartile of those ratios. Targets: <= 1.02
where the stock step is under 20 ms, <= 1.01 from 20 ms up. Then a profiled fit of ``ours`` breaks the cost down by
callback (hook time per step; under 2 processes a vote also waits there for the slower rank). Writes
``benchmarks/results/callback_overhead.json``.

    .venv/bin/python -m benchmarks.callback_overhead [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks._common import machine_info, meets, paired_ratios, spread
from benchmarks._summary import (
    Row,
    bound_text,
    md_ms,
    md_ratio,
    md_table,
    span_of,
    summary_row,
)
from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
JOB = "benchmarks._callback_job"
RESULTS = Path(__file__).resolve().parent / "results"
LONG_STEP_S = 0.020  # from here on the target is the tighter one
TARGETS = {"short": 1.02, "long": 1.01}


def run(processes: int, rounds: int, steps: int, d_model: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="callback-bench-") as workdir:
        out = Path(workdir) / "out.json"
        job = ["-m", JOB, f"--rounds={rounds}", f"--steps={steps}", f"--d-model={d_model}", f"--workdir={workdir}",
               f"--out={out}"]  # fmt: skip
        done = subprocess.run(launch_command(job, processes), env=launch_environment([ROOT]), capture_output=True,
                              text=True, timeout=1800)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{processes} process(es), d_model={d_model}:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 20 steps (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "callback_overhead.json"), help="where to write the JSON")
    args = parser.parse_args()
    rounds, steps, widths = (1, 20, [32]) if args.quick else (9, 200, [32, 256])

    rows = []
    for processes in (1, 2):
        for d_model in widths:
            measured = run(processes, rounds, steps, d_model)
            per_round = measured["rounds"]
            ratio = paired_ratios([r["ours"] / r["stock"] for r in per_round])
            stock_s = statistics.median(r["stock"] for r in per_round)
            target = TARGETS["long" if stock_s >= LONG_STEP_S else "short"]
            rows.append({
                "processes": processes, "d_model": d_model, "per_round": per_round,
                "step_s": {v: spread([r[v] for r in per_round]) for v in ("stock", "ours")},
                "ours_over_stock": ratio, "target": target, "holds": meets(ratio, target),
                "breakdown_ms": measured["breakdown_ms"],
            })  # fmt: skip
    print(f"callback overhead, example transformer, {rounds} rounds of {steps} steps, order swapped every round")
    for r in rows:
        s, ratio = r["step_s"], r["ours_over_stock"]
        verdict = "holds" if r["holds"] else "MISSED"
        print(
            f"  {r['processes']} process(es), d_model={r['d_model']}: stock {s['stock']['median'] * 1e3:.2f} ms, ours "
            f"{s['ours']['median'] * 1e3:.2f} ms; ours/stock median {ratio['median']:.3f}, upper quartile "
            f"{ratio['upper_quartile']:.3f} (target <= {r['target']}: {verdict})"
        )
        print("    hook ms/step: " + ", ".join(f"{name} {ms:.3f}" for name, ms in r["breakdown_ms"].items()))
    result = {
        "machine": machine_info(),
        "config": {"rounds": rounds, "steps": steps, "widths": widths, "quick": args.quick},
        "rows": rows,
        "holds": all(r["holds"] for r in rows),
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    rows = []
    for entry in result["rows"]:
        ratio, stock_ms = entry["ours_over_stock"], entry["step_s"]["stock"]["median"] * 1e3
        top = ", ".join(f"{name} {ms:.2f}" for name, ms in list(entry["breakdown_ms"].items())[:3])
        measure = (
            f"step time, every lightning-scale callback of the command / stock ModelCheckpoint + EarlyStopping, "
            f"{entry['processes']} "
            f"process(es), {stock_ms:.1f} ms step (hook ms/step: {top})"
        )
        rows.append(summary_row("callback_overhead", measure, ratio["median"], span_of(ratio), "x",
                        bound_text(ratio, entry["target"]), entry["holds"]))  # fmt: skip
    return rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    rows = []
    for entry in result["rows"]:
        breakdown = ", ".join(f"{name} {ms:.3f}" for name, ms in entry["breakdown_ms"].items())
        rows.append([str(entry["processes"]), str(entry["d_model"]), md_ms(entry["step_s"]["stock"]),
                     md_ms(entry["step_s"]["ours"]), md_ratio(entry["ours_over_stock"]), breakdown])  # fmt: skip
    header = ["processes", "d_model", "stock ms per step", "ours ms per step", "ours / stock, paired",
              "hook ms per step, by callback (profiled fit)"]  # fmt: skip
    return f"{result['config']['rounds']} rounds of {result['config']['steps']} steps:\n\n" + md_table(header, rows)


if __name__ == "__main__":
    main()
