"""Preemption cost on 2-process CPU DDP (torchrun, gloo), measured in one run.

1. Per-step overhead of SpotPreemption's flag vote (``check_every_n_steps=1``): the median step time with the
   callback over the median without it, variants interleaved, several repeats (target <= 1.01).
2. Seconds from a SIGTERM (sent to rank 1) to a durable checkpoint of a ~100 MB training state.

Prints a table and writes ``benchmarks/results/preemption_cost.json``.

    .venv/bin/python benchmarks/preemption_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, spread

from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
TARGET_VOTE_RATIO = 1.01


def run_job(variant: str, steps: int, d_model: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix=f"preempt-bench-{variant}-"))
    try:
        job = [str(ROOT / "benchmarks" / "_preemption_job.py"), f"--variant={variant}", f"--steps={steps}"]
        job += [f"--d-model={d_model}", f"--workdir={workdir}"]
        command, env = launch_command(job, 2), launch_environment([ROOT])
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if variant == "notice":
            metrics = next(workdir.glob("log/version_*/metrics.csv")).read_text().splitlines()
            key = "preemption/seconds_to_durable"
            seconds = [float(row[key]) for row in csv.DictReader(metrics) if row.get(key)]
            size = max(p.stat().st_size for p in (workdir / "ckpt").glob("*.ckpt")) / 1e6
            return {"notice_to_durable_s": seconds[0], "ckpt_mb": size}
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        return json.loads((workdir / "steps.json").read_text())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps (smoke test)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "preemption_cost.json"))
    args = parser.parse_args()
    repeats, steps, d_model = (1, 30, 64) if args.quick else (5, 200, 416)

    step_times: dict[str, list[float]] = {"none": [], "vote": []}
    for _ in range(repeats):
        for variant in step_times:  # interleaved: drift on a shared machine hits both alike
            step_times[variant].append(run_job(variant, steps, 64)["step_s"])
    notices = [run_job("notice", 40, d_model) for _ in range(max(1, repeats // 2 + 1))]

    ratio = statistics.median(step_times["vote"]) / statistics.median(step_times["none"])
    durable = spread([n["notice_to_durable_s"] for n in notices])
    print(f"preemption cost, 2 processes (gloo), {repeats} repeats of {steps} steps")
    for variant, values in step_times.items():
        s = spread(values)
        print(f"  ms/step {variant:<5} {s['median'] * 1e3:7.2f} ({s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f})")
    verdict = "holds" if ratio <= TARGET_VOTE_RATIO else "MISSED"
    print(f"  vote/none step time: {ratio:.3f} (target <= {TARGET_VOTE_RATIO}: {verdict})")
    print(
        f"  SIGTERM -> durable checkpoint ({notices[0]['ckpt_mb']:.0f} MB): {durable['median']:.2f} s "
        f"({durable['min']:.2f}-{durable['max']:.2f}), {len(notices)} runs"
    )
    machine = machine_info()
    result = {
        "machine": machine,
        "config": {"repeats": repeats, "steps": steps, "d_model": d_model, "quick": args.quick},
        "step_s": {v: spread(t) for v, t in step_times.items()},
        "vote_over_none": ratio,
        "notice_to_durable_s": durable,
        "ckpt_mb": notices[0]["ckpt_mb"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
