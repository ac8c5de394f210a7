"""Data parallel step time and memory: ``data_parallel`` (plain, ZeRO-1, fp16, PowerSGD) and ``model_parallel``
(FSDP2) vs Lightning's ``ddp`` vs a raw torch DDP loop, on the example transformer, 2 CPU processes (gloo, 1 thread
each).

Step time: every variant in the same two processes, the order rotated every round; each round's median step over
``ddp``'s of the same round is one paired ratio, and a target is judged by the upper quartile of those ratios (see
``_common.py``). ``data_parallel`` with ``zero_stage=0`` and no compression runs ``ddp``'s own code: its ratio is
this machine's noise floor, not a speed-up, and has no target.

Memory, at a width whose state is ~70 MB (d_model=416): one launch per variant (a process's resident peak is its
own), each rank's peak over its steady steps (``_peak_memory.py``: the resident set on the CPU, with glibc's mmap
threshold at 1 MiB; the allocator's peak on a GPU), the models built under ``Trainer.init_module(empty_init=True)``,
as sharded ones should be, next to the bytes it holds by construction (parameters, gradients, optimizer state, from
tensor sizes), and the gradient payload each rank all-reduces per step. Writes
``benchmarks/results/data_parallel_step.json``.

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

from _common import MEMORY_ENV, machine_info, paired_ratios, spread

from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).resolve().parent / "_data_parallel_job.py"
RESULTS = Path(__file__).resolve().parent / "results"


MEMORY_D_MODEL = 416
MEMORY_VARIANTS = ("ddp", "zero1", "fsdp")


def run(variants: list[str], rounds: int, steps: int, *options: str) -> dict[str, dict]:
    """One torchrun launch of 2 processes that runs ``variants`` for ``rounds`` rounds; their results by name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        job = [str(JOB), f"--variants={','.join(variants)}", f"--rounds={rounds}", f"--steps={steps}", *options,
               f"--out={out}"]  # fmt: skip
        env = launch_environment([ROOT], **(MEMORY_ENV if "--memory" in options else {}))
        done = subprocess.run(launch_command(job, 2), env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{variants} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 20 steps, a small memory width (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "data_parallel_step.json"))
    args = parser.parse_args()
    variants = ["raw", "ddp", "data_parallel", "zero1", "fsdp"] + ([] if args.quick else ["fp16", "powersgd"])
    rounds, steps, memory_d_model = (2, 20, 64) if args.quick else (9, 150, MEMORY_D_MODEL)

    timed = run(variants, rounds, steps)
    memory = {v: run([v], 1, 20, f"--d-model={memory_d_model}", "--memory")[v] for v in MEMORY_VARIANTS}
    table = {}
    for variant, result in timed.items():
        ratios = [mine / ddp for mine, ddp in zip(result["step_s"], timed["ddp"]["step_s"], strict=True)]
        table[variant] = {
            "step_s": spread(result["step_s"]),
            "over_ddp": paired_ratios(ratios),
            "memory_per_rank": result["memory"],
            "payload_bytes_per_step": result["payload_bytes"],
        }
    for variant, result in memory.items():
        table[variant]["memory_at_width"] = {"d_model": memory_d_model, "state_per_rank": result["memory"],
                                             "peak_per_rank": result["peak_bytes"]}  # fmt: skip
    print(f"data parallel, example transformer, 2 processes (gloo), {rounds} rounds of {steps} steps, rotated")
    header = ("variant", "ms/step", "(min-max)", "/ ddp", "(upper q.)", "all B/rank", "payload B/step")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (14, 8, 15, 6, 10, 12, 15), strict=True)))
    for variant, row in table.items():
        s, ratio = row["step_s"], row["over_ddp"]
        low_high = f"{s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f}"
        print(
            f"{variant:>14} {s['median'] * 1e3:8.2f} {low_high:>15} {ratio['median']:6.3f} "
            f"{ratio['upper_quartile']:10.3f} {max(sum(m.values()) for m in row['memory_per_rank']):12,} "
            f"{row['payload_bytes_per_step']:15,.0f}"
        )
    print(f"memory at d_model={memory_d_model}, MB per rank (max over ranks): held by construction / peak in a step")
    for variant in MEMORY_VARIANTS:
        at = table[variant]["memory_at_width"]
        held = max(sum(m.values()) for m in at["state_per_rank"]) / 1e6
        print(f"{variant:>14} {held:9.1f} / {max(at['peak_per_rank']) / 1e6:9.1f}")
    config = {"rounds": rounds, "steps": steps, "variants": variants, "memory_d_model": memory_d_model,
              "quick": args.quick}  # fmt: skip
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "config": config, "table": table}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
