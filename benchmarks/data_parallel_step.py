"""Data parallel step time and memory: ``data_parallel`` (plain, ZeRO-1, fp16, PowerSGD) and ``model_parallel``
(FSDP2) vs Lightning's ``ddp`` vs a raw torch DDP loop, on the example transformer, 2 CPU processes (gloo, 1 thread
each). Variants interleaved within each repeat; medians (min-max) of the per-run median step. Also: the bytes each
rank holds for training (parameters, gradients, optimizer state, from tensor sizes) and the gradient payload each
rank all-reduces per step. Writes ``benchmarks/results/data_parallel_step.json``.

    .venv/bin/python benchmarks/data_parallel_step.py [--quick]
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
JOB = Path(__file__).resolve().parent / "_data_parallel_job.py"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 1.02  # data_parallel / ddp step time


def run(variants: list[str], steps: int) -> dict[str, dict]:
    """One torchrun launch of 2 processes that runs ``variants`` one after another; their results by name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        command = launch_command([str(JOB), ",".join(variants), str(steps), str(out)], 2)
        done = subprocess.run(command, env=launch_environment([ROOT]), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{variants} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one repeat of 20 steps, five variants in one launch (smoke test)"
    )
    parser.add_argument("--out", default=str(RESULTS / "data_parallel_step.json"))
    args = parser.parse_args()
    variants = ["raw", "ddp", "data_parallel", "zero1", "fsdp"] + ([] if args.quick else ["fp16", "powersgd"])
    repeats, steps = (1, 20) if args.quick else (5, 200)

    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(repeats):  # interleaved: drift on a shared machine hits every variant alike
        # a fresh pair of processes per variant; the smoke run starts one pair for all (process start is most of it)
        for launch in [variants] if args.quick else [[variant] for variant in variants]:
            for variant, result in run(launch, steps).items():
                runs[variant].append(result)
    table = {}
    for variant, results in runs.items():
        ratios = [r["step_s"] / d["step_s"] for r, d in zip(results, runs["ddp"], strict=True)]
        table[variant] = {
            "step_s": spread([r["step_s"] for r in results]),
            "over_ddp": spread(ratios),  # paired within each repeat
            "min_over_ddp_min": min(r["step_s"] for r in results) / min(d["step_s"] for d in runs["ddp"]),
            "memory_per_rank": results[0]["memory"],
            "payload_bytes_per_step": results[-1]["payload_bytes"],
        }
    ratio = table["data_parallel"]["over_ddp"]["median"]
    best = table["data_parallel"]["min_over_ddp_min"]  # the least disturbed run of each: robust to a noisy machine
    print(f"data parallel, example transformer, 2 processes (gloo), {repeats} repeats, {steps} steps; medians")
    header = ("variant", "ms/step", "(min-max)", "/ ddp", "optimizer B/rank", "all B/rank", "payload B/step")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (14, 8, 15, 6, 17, 17, 15), strict=True)))
    for variant, row in table.items():
        s = row["step_s"]
        low_high = f"{s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f}"
        print(
            f"{variant:>14} {s['median'] * 1e3:8.2f} {low_high:>15} "
            f"{row['over_ddp']['median']:6.3f} {max(m['optimizer'] for m in row['memory_per_rank']):17,} "
            f"{max(sum(m.values()) for m in row['memory_per_rank']):17,} "
            f"{row['payload_bytes_per_step']:15,.0f}"
        )
    verdict = "holds" if ratio <= TARGET else "MISSED"
    print(f"data_parallel / ddp step time: median of paired ratios {ratio:.3f}, fastest over fastest {best:.3f} "
          f"(target <= {TARGET} on the median: {verdict})")  # fmt: skip
    config = {"repeats": repeats, "steps": steps, "variants": variants, "quick": args.quick}
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "config": config, "table": table}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
