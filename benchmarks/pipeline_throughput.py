"""Pipeline throughput: ``pipeline_parallel`` vs a raw torch.distributed.pipelining loop (the same 1F1B schedule,
microbatches and model) on 2 CPU processes (gloo, 1 thread each), vs one process with 1 and with 2 threads, and the
measured bubble against theory (p-1)/(m+p-1). Writes ``benchmarks/results/pipeline_throughput.json``.

    .venv/bin/python benchmarks/pipeline_throughput.py [--quick]

Raw and ours run in the same two processes, alternating every round (see ``_pipeline_job.py``): the ratio of each
round's pair, then the median over rounds. Measured bubble = 1 - (one process, 1 thread, per step / p) / pipeline
step: the share of the pipeline's time not spent on a perfect split of the work (schedule bubble plus transfers).
Lightning's own cost per step is measured on one process: a stock Trainer on the same model (its training_step logs
the loss, as pipeline_parallel does) minus the raw loop; compare it with ours minus raw.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, spread

from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).resolve().parent / "_pipeline_job.py"
RESULTS = Path(__file__).resolve().parent / "results"
STAGES = 2
TARGET = 0.95  # ours / raw throughput


def run(job: list[str], processes: int) -> dict[str, list[float]]:
    """One launch of ``_pipeline_job.py`` (under torchrun for several processes): each variant's per-round steps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        command, env = launch_command([str(JOB), *job, str(out)], processes), launch_environment([ROOT])
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{job} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two rounds, one width, m=4 (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "pipeline_throughput.json"))
    args = parser.parse_args()
    rounds, widths, ms, steps = (2, [128], [4], 12) if args.quick else (11, [256, 1024], [2, 4, 8], 40)

    rows = []
    for width in widths:
        singles = run(["single", str(width), str(steps), str(rounds)], 1)
        one = spread(singles["single"])["median"]
        lightning_cost = spread([a - b for a, b in zip(singles["lightning"], singles["single"], strict=True)])
        for m in ms:
            pipes = run(["pipeline", str(width), str(m), str(steps), str(rounds)], STAGES)
            raw, ours = spread(pipes["raw"]), spread(pipes["ours"])
            rows.append({
                "width": width, "microbatches": m,
                "single_1t_s": spread(singles["single"]), "single_2t_s": spread(singles["single-2t"]),
                "raw_s": raw, "ours_s": ours, "lightning_1t_s": spread(singles["lightning"]),
                # seconds a step over the raw loop: ours (2 processes, paired per round) and stock Lightning (1 process)
                "ours_minus_raw_s": spread([o - r for r, o in zip(pipes["raw"], pipes["ours"], strict=True)]),
                "lightning_minus_raw_1p_s": lightning_cost,
                # paired within each round (seconds apart, same processes), then the median over rounds
                "ours_over_raw_throughput": spread([r / o for r, o in zip(pipes["raw"], pipes["ours"], strict=True)]),
                "bubble_theory": (STAGES - 1) / (m + STAGES - 1),
                "bubble_measured_raw": 1 - (one / STAGES) / raw["median"],
                "bubble_measured_ours": 1 - (one / STAGES) / ours["median"],
            })  # fmt: skip

    print(f"pipeline throughput: 2 stages (gloo, 1 thread each), 1F1B, {rounds} rounds, medians; ms per step")
    print(f"{'D':>5} {'m':>2} {'1 proc 1t':>10} {'1 proc 2t':>10} {'raw':>8} {'ours':>8} {'ours/raw':>9} "
          f"{'bubble theory':>14} {'measured raw':>13} {'ours':>6} "
          f"{'ours-raw':>9} {'Lightning-raw 1p':>17}")  # fmt: skip
    for r in rows:
        print(
            f"{r['width']:>5} {r['microbatches']:>2} {r['single_1t_s']['median'] * 1e3:10.2f} "
            f"{r['single_2t_s']['median'] * 1e3:10.2f} {r['raw_s']['median'] * 1e3:8.2f} "
            f"{r['ours_s']['median'] * 1e3:8.2f} "
            f"{r['ours_over_raw_throughput']['median']:9.3f} {r['bubble_theory']:14.2f} "
            f"{r['bubble_measured_raw']:13.2f} {r['bubble_measured_ours']:6.2f} "
            f"{r['ours_minus_raw_s']['median'] * 1e3:9.2f} {r['lightning_minus_raw_1p_s']['median'] * 1e3:17.2f}"
        )
    worst = min(r["ours_over_raw_throughput"]["median"] for r in rows)
    print(
        f"ours/raw throughput, worst row: {worst:.3f} (target >= {TARGET}: {'holds' if worst >= TARGET else 'MISSED'})"
    )
    config = {"rounds": rounds, "widths": widths, "microbatches": ms, "steps": steps, "quick": args.quick}
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "config": config, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
