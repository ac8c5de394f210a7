"""Pipeline throughput: ``pipeline_parallel`` vs a raw torch.distributed.pipelining loop (the same 1F1B schedule,
microbatches and model) on 2 CPU processes (gloo, 1 thread each), vs one process with 1 and with 2 threads, and the
measured bubble against theory (p-1)/(m+p-1). Writes ``benchmarks/results/pipeline_throughput.json``.

    .venv/bin/python -m benchmarks.pipeline_throughput [--quick]

Raw and ours run in the same two processes, alternating every round (see ``_pipeline_job.py``): the ratio of each
round's pair; a configuration meets the target when the lower quartile of its paired ratios does, and the worst
configuration decides (see ``_common.py``). Memory: each stage's peak in a step of ``pipeline_parallel`` at
D=1024 (m=4), next to one process training the whole model, with the parameters and gradients each holds
(``_peak_memory.py``; glibc's mmap threshold at 1 MiB, as in ``data_parallel_step.py``). Measured bubble = 1 - (one
process, 1 thread, per step / p) / pipeline step: the share of the pipeline's time not spent on a perfect split of the
work (schedule bubble plus transfers). Lightning's own cost per step is measured on one process: a stock Trainer on
the same model (its training_step logs the loss, as pipeline_parallel does) minus the raw loop; compare it with ours
minus raw. Of ours minus raw, what Lightning's training loop spends on its per-step broadcast of rank 0's SIGTERM
flag (a collective every step, which a raw loop does not run and the command's SpotPreemption replaces) is measured
apart: ours minus ours without that broadcast, paired in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks._common import MEMORY_ENV, machine_info, meets, paired_ratios, spread
from benchmarks._summary import (
    Row,
    bound_text,
    md_mb,
    md_ms,
    md_ratio,
    md_table,
    span_of,
    summary_row,
)
from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
JOB = "benchmarks._pipeline_job"
RESULTS = Path(__file__).resolve().parent / "results"
STAGES = 2
TARGET = 0.95  # ours / raw throughput


def run(job: list[str], processes: int) -> dict[str, list]:
    """One launch of ``_pipeline_job.py`` (under torchrun for several processes): each variant's per-round steps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        command = launch_command(["-m", JOB, *job, str(out)], processes)
        env = launch_environment([ROOT], **(MEMORY_ENV if job[0] == "memory" else {}))
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{job} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, one width, m=4 (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "pipeline_throughput.json"))
    args = parser.parse_args()
    rounds, widths, ms, steps = (1, [128], [4], 8) if args.quick else (11, [256, 1024], [2, 4, 8], 40)

    rows = []
    for width in widths:
        singles = run(["single", str(width), str(steps), str(rounds)], 1)
        one = spread(singles["single"])["median"]
        lightning_cost = spread([a - b for a, b in zip(singles["lightning"], singles["single"], strict=True)])
        for m in ms:
            pipes = run(["pipeline", str(width), str(m), str(steps), str(rounds)], STAGES)
            raw, ours = spread(pipes["raw"]), spread(pipes["ours"])
            broadcast = [o - q for o, q in zip(pipes["ours"], pipes["quiet"], strict=True)]
            rows.append({
                "width": width, "microbatches": m,
                "single_1t_s": spread(singles["single"]), "single_2t_s": spread(singles["single-2t"]),
                "raw_s": raw, "ours_s": ours, "lightning_1t_s": spread(singles["lightning"]),
                # seconds a step over the raw loop: ours (2 processes, paired per round) and stock Lightning (1 process)
                "ours_minus_raw_s": spread([o - r for r, o in zip(pipes["raw"], pipes["ours"], strict=True)]),
                "ours_quiet_s": spread(pipes["quiet"]),  # without Lightning's per-step SIGTERM broadcast
                "sigterm_broadcast_s": spread(broadcast),
                "lightning_minus_raw_1p_s": lightning_cost,
                # paired within each round (seconds apart, same processes), then the median over rounds
                "ours_over_raw_throughput": paired_ratios([r / o for r, o in zip(pipes["raw"], pipes["ours"],
                                                                                 strict=True)]),
                "bubble_theory": (STAGES - 1) / (m + STAGES - 1),
                "bubble_measured_raw": 1 - (one / STAGES) / raw["median"],
                "bubble_measured_ours": 1 - (one / STAGES) / ours["median"],
            })  # fmt: skip

    print(f"pipeline throughput: 2 stages (gloo, 1 thread each), 1F1B, {rounds} rounds, medians; ms per step")
    print(f"{'D':>5} {'m':>2} {'1 proc 1t':>10} {'1 proc 2t':>10} {'raw':>8} {'ours':>8} {'ours/raw':>9} "
          f"{'bubble theory':>14} {'measured raw':>13} {'ours':>6} "
          f"{'ours-raw':>9} {'of it broadcast':>16} {'Lightning-raw 1p':>17}")  # fmt: skip
    for r in rows:
        print(
            f"{r['width']:>5} {r['microbatches']:>2} {r['single_1t_s']['median'] * 1e3:10.2f} "
            f"{r['single_2t_s']['median'] * 1e3:10.2f} {r['raw_s']['median'] * 1e3:8.2f} "
            f"{r['ours_s']['median'] * 1e3:8.2f} "
            f"{r['ours_over_raw_throughput']['median']:9.3f} {r['bubble_theory']:14.2f} "
            f"{r['bubble_measured_raw']:13.2f} {r['bubble_measured_ours']:6.2f} "
            f"{r['ours_minus_raw_s']['median'] * 1e3:9.2f} {r['sigterm_broadcast_s']['median'] * 1e3:16.2f} "
            f"{r['lightning_minus_raw_1p_s']['median'] * 1e3:17.2f}"
        )
    for r in rows:
        r["holds"] = meets(r["ours_over_raw_throughput"], TARGET, at_most=False)
    worst = min(rows, key=lambda r: r["ours_over_raw_throughput"]["lower_quartile"])
    print(f"ours/raw throughput, worst configuration D={worst['width']}, m={worst['microbatches']}: lower quartile "
          f"{worst['ours_over_raw_throughput']['lower_quartile']:.3f} (target >= {TARGET}: "
          f"{'holds' if worst['holds'] else 'MISSED'})")  # fmt: skip
    memory_width, memory_m = (128, 4) if args.quick else (1024, 4)
    memory = {"width": memory_width, "microbatches": memory_m,
              "one_process": run(["memory", str(memory_width)], 1),
              "per_stage": run(["memory", str(memory_width), str(memory_m)], STAGES)}  # fmt: skip
    one, stages = memory["one_process"], memory["per_stage"]
    per_stage = ", ".join(f"{p / 1e6:.1f} (holds {h / 1e6:.1f})" for p, h in zip(stages["peak"], stages["held"],
                                                                                  strict=True))  # fmt: skip
    print(f"memory at D={memory_width}, MB: one process peak {one['peak'][0] / 1e6:.1f} (holds "
          f"{one['held'][0] / 1e6:.1f}); per stage peak {per_stage}")  # fmt: skip
    config = {"rounds": rounds, "widths": widths, "microbatches": ms, "steps": steps, "quick": args.quick}
    result = {"machine": machine_info(), "config": config, "rows": rows, "memory": memory}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """Every width and microbatch count measured, each judged by the lower quartile of its paired rounds."""
    rows = []
    for entry in result["rows"]:
        width, m, ratio = entry["width"], entry["microbatches"], entry["ours_over_raw_throughput"]
        extra, stock = entry["ours_minus_raw_s"]["median"] * 1e3, entry["lightning_minus_raw_1p_s"]["median"] * 1e3
        broadcast = entry["sigterm_broadcast_s"]["median"] * 1e3
        measure = (f"throughput, pipeline_parallel / raw torch pipelining, D={width}, m={m}, 2 stages (ours - raw "
                   f"{extra:.2f} ms a step, of which Lightning's per-step SIGTERM broadcast {broadcast:.2f} ms; stock "
                   f"Lightning - raw loop, 1 process: {stock:.2f} ms)")  # fmt: skip
        rows.append(summary_row("pipeline_throughput", measure, ratio["median"], span_of(ratio), "x",
                        bound_text(ratio, 0.95, at_most=False), entry["holds"]))  # fmt: skip
        ideal, measured = 1 - entry["bubble_theory"], 1 - entry["bubble_measured_ours"]
        label = (
            f"parallel efficiency, (1 process / 2) / pipeline_parallel step, D={width}, m={m} (schedule's ideal "
            f"{ideal:.2f})"
        )
        rows.append(summary_row("pipeline_throughput", label, measured, None, "x"))
    memory = result["memory"]
    one, stages = memory["one_process"], memory["per_stage"]
    held = max(stages["held"]) / one["held"][0]
    measure = (
        f"peak memory in a step, largest pipeline_parallel stage / one process training the whole model, "
        f"D={memory['width']}, m={memory['microbatches']} (parameters and gradients held: {held:.2f})"
    )
    rows.append(summary_row("pipeline_throughput", measure, max(stages["peak"]) / one["peak"][0], None, "x"))
    return rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    rows = [
        [str(r["width"]), str(r["microbatches"]), md_ms(r["single_1t_s"]), md_ms(r["raw_s"]), md_ms(r["ours_s"]),
         md_ratio(r["ours_over_raw_throughput"]), f"{r['ours_minus_raw_s']['median'] * 1e3:.2f}",
         f"{r['sigterm_broadcast_s']['median'] * 1e3:.2f}",
         f"{r['lightning_minus_raw_1p_s']['median'] * 1e3:.2f}",
         f"{r['bubble_theory']:.2f} / {r['bubble_measured_raw']:.2f} / {r['bubble_measured_ours']:.2f}"]
        for r in result["rows"]
    ]  # fmt: skip
    header = ["D", "m", "1 process ms", "raw ms", "ours ms", "ours / raw throughput, paired", "ours - raw ms",
              "of it, Lightning's SIGTERM broadcast ms", "Lightning - raw ms (1 process)",
              "bubble: theory / raw / ours"]  # fmt: skip
    memory = result["memory"]
    one, stages = memory["one_process"], memory["per_stage"]
    per_stage = ", ".join(f"{md_mb(peak)} (holds {md_mb(held)})" for peak, held in zip(stages["peak"], stages["held"],
                                                                                   strict=True))  # fmt: skip
    return (
        md_table(header, rows) + f"\n\nPeak in a step at D={memory['width']}, m={memory['microbatches']}, MB: one "
        f"process {md_mb(one['peak'][0])} (holds {md_mb(one['held'][0])}); per stage {per_stage}."
    )


if __name__ == "__main__":
    main()
