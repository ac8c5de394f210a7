"""Data parallel step time and memory: ``data_parallel`` (plain, ZeRO-1, ZeRO-2, fp16, PowerSGD) and ``model_parallel``
(FSDP2) vs Lightning's ``ddp`` vs a raw torch DDP loop, with their peers in the same run: torch's
``ZeroRedundancyOptimizer`` under Lightning's ``ddp`` and Lightning's ``ModelParallelStrategy`` sharding the same
units (Lightning's ``FSDPStrategy`` refuses the CPU); the example transformer, 2 CPU processes (gloo, 1 thread each).

Step time: every variant in the same two processes, the order rotated every round; each round's median step over
``ddp``'s of the same round is one paired ratio, and a target is judged by the upper quartile of those ratios (see
``_common.py``). At the example's width (d_model=32: latency-bound) and at d_model=256 for the ZeRO variants (the
gradients' bytes count). ``data_parallel`` with ``zero_stage=0`` and no compression runs ``ddp``'s own code: its ratio
is this machine's noise floor, not a speed-up, and has no target.

Memory, at a size whose training state under ``ddp`` is over 400 MB per rank (8 blocks of d_model=1024: 1.6 GB), one
launch per variant (a process's resident peak is its own), the variants in turn, twice in alternating order; each
rank's peak over its steady steps and its resident size at the end of a step (``_peak_memory.py``: less the
process's size before the model was built, and less what the same launch adds with the example's small model, the
runtime's own share; glibc's mmap threshold at 1 MiB), the models built under
``Trainer.init_module(empty_init=True)``, as sharded ones should be, next to the bytes it holds by construction
(parameters, gradients, optimizer state, and the reduction buffers: DDP's buckets copy every gradient, ZeRO-1 keeps
one buffer of the gradients' size). Eight blocks: FSDP's transient, a unit's unsharded parameters and their full
gradients, is then one block of eight, as in models people shard (with the example's 2 blocks a unit is half the
model, and FSDP2 measured 0.70 of ``ddp``); d_model=1024: an activation is 1 MiB, at the mmap threshold, so the
activations a step frees are not counted as held. Writes
``benchmarks/results/data_parallel_step.json``.

    .venv/bin/python -m benchmarks.data_parallel_step [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks._common import MEMORY_ENV, machine_info, paired_ratios, rotated, spread
from benchmarks._summary import (
    Row,
    md_mb,
    md_ms,
    md_ratio,
    md_table,
    span_of,
    summary_row,
    verdict_of,
)
from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
JOB = "benchmarks._data_parallel_job"
RESULTS = Path(__file__).resolve().parent / "results"

MEMORY_D_MODEL = 1024
MEMORY_N_LAYERS = 8
SMALL_D_MODEL = 32
SMALL_N_LAYERS = 2  # the example's, the job's default
WIDE_D_MODEL = 256
MEMORY_VARIANTS = ("ddp", "zero1", "zero2", "torch_zero", "fsdp", "lightning_model_parallel")
QUICK_MEMORY_VARIANTS = ("ddp", "fsdp")  # the smoke run: the memory path once per kind of state, replicated and sharded
WIDE_VARIANTS = ("ddp", "zero1", "zero2", "torch_zero")
TIMED = ("raw", "ddp", "data_parallel", "zero1", "zero2", "torch_zero", "fsdp", "lightning_model_parallel")


def run(variants: list[str], rounds: int, steps: int, *options: str) -> dict[str, dict]:
    """One torchrun launch of 2 processes that runs ``variants`` for ``rounds`` rounds; their results by name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        job = ["-m", JOB, f"--variants={','.join(variants)}", f"--rounds={rounds}", f"--steps={steps}", *options,
               f"--out={out}"]  # fmt: skip
        env = launch_environment([ROOT], **(MEMORY_ENV if "--memory" in options else {}))
        done = subprocess.run(launch_command(job, 2), env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{variants} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def timing(timed: dict[str, dict]) -> dict[str, dict]:
    """Each variant's step times and its paired ratios to ``ddp`` (and ZeRO's to torch's ZeRO, model_parallel's to
    Lightning's ModelParallelStrategy)."""
    table = {}
    peers = {"zero1": "torch_zero", "zero2": "torch_zero", "fsdp": "lightning_model_parallel"}
    for variant, result in timed.items():
        entry = {"step_s": spread(result["step_s"]), "over_ddp": _paired(result, timed["ddp"]),
                 "memory_per_rank": result["memory"], "payload_bytes_per_step": result["payload_bytes"]}  # fmt: skip
        parts = [per_round for per_round in result.get("zero_ms", []) if per_round]
        if parts:  # where ZeRO's own time went (ms per step, median over rounds)
            entry["zero_ms_per_step"] = {name: statistics.median(p[name] for p in parts) for name in parts[0]}
        if peers.get(variant) in timed:
            entry["over_peer"] = {"peer": peers[variant], **_paired(result, timed[peers[variant]])}
        table[variant] = entry
    return table


def _paired(mine: dict, other: dict) -> dict[str, float]:
    return paired_ratios([a / b for a, b in zip(mine["step_s"], other["step_s"], strict=True)])


def memory(rounds: int, d_model: int, n_layers: int, variants: tuple[str, ...] = MEMORY_VARIANTS) -> dict[str, dict]:
    """Per variant (``ddp`` first among ``variants``): per round, each rank's peak and resident size at the end of a
    step, less what the same launch costs with the example's own small model (the runtime: Lightning, the process
    group, the data, the allocator's arenas), so that what is left is the training state's share; the bytes held by
    construction; the peak's ratio to ``ddp``'s of the same round."""
    launches: dict[str, list[dict]] = {variant: [] for variant in variants}
    runtime: dict[str, int] = {}
    small_size = (d_model, n_layers) == (SMALL_D_MODEL, SMALL_N_LAYERS)  # --quick: the small launch is the measured one
    for index in range(rounds):
        for variant in rotated(list(variants), index):
            if variant not in runtime:
                small = run([variant], 1, 20, f"--d-model={SMALL_D_MODEL}", "--memory")[variant]
                runtime[variant] = max(small["rest_bytes"]) - max(sum(rank.values()) for rank in small["memory"])
                if small_size:
                    launches[variant].append(small)
                    continue
            size = (f"--d-model={d_model}", f"--n-layers={n_layers}")
            launches[variant].append(run([variant], 1, 20, *size, "--memory")[variant])
    table = {}
    for variant, results in launches.items():
        held = max(sum(rank.values()) for rank in results[0]["memory"])
        peaks = [[peak - runtime[variant] for peak in r["peak_bytes"]] for r in results]
        rests = [[rest - runtime[variant] for rest in r["rest_bytes"]] for r in results]
        table[variant] = {"d_model": d_model, "n_layers": n_layers, "state_per_rank": results[0]["memory"],
                          "held_bytes": held, "runtime_bytes": runtime[variant], "peak_per_rank": peaks,
                          "rest_per_rank": rests, "rest_over_held": max(map(max, rests)) / held}  # fmt: skip
    for entry in table.values():
        ddp = table["ddp"]["peak_per_rank"]
        ratios = [max(mine) / max(theirs) for mine, theirs in zip(entry["peak_per_rank"], ddp, strict=True)]
        entry["peak_over_ddp"] = paired_ratios(ratios)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round of 20 steps, small widths, memory of ddp and FSDP2 (smoke test)",
    )
    parser.add_argument("--out", default=str(RESULTS / "data_parallel_step.json"))
    args = parser.parse_args()
    variants = list(TIMED) + ([] if args.quick else ["fp16", "powersgd"])
    rounds, steps, wide_d_model = (1, 20, 64) if args.quick else (9, 150, WIDE_D_MODEL)
    table = timing(run(variants, rounds, steps))
    wide_rounds, wide_steps = (1, 20) if args.quick else (7, 40)
    wide = timing(run(list(WIDE_VARIANTS), wide_rounds, wide_steps, f"--d-model={wide_d_model}"))
    if args.quick:  # one launch per variant: the sharded ones' rows, not their peers' (timed above)
        held = memory(1, SMALL_D_MODEL, SMALL_N_LAYERS, QUICK_MEMORY_VARIANTS)
    else:
        held = memory(2, MEMORY_D_MODEL, MEMORY_N_LAYERS)
    print(f"data parallel, example transformer, 2 processes (gloo), {rounds} rounds of {steps} steps, rotated")
    header = ("variant", "ms/step", "(min-max)", "/ ddp", "(upper q.)", "all B/rank", "payload B/step")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (24, 8, 15, 6, 10, 12, 15), strict=True)))
    for variant, entry in table.items():
        s, ratio = entry["step_s"], entry["over_ddp"]
        low_high = f"{s['min'] * 1e3:.2f}-{s['max'] * 1e3:.2f}"
        print(
            f"{variant:>24} {s['median'] * 1e3:8.2f} {low_high:>15} {ratio['median']:6.3f} "
            f"{ratio['upper_quartile']:10.3f} {max(sum(m.values()) for m in entry['memory_per_rank']):12,} "
            f"{entry['payload_bytes_per_step']:15,.0f}"
        )
    print(f"at d_model={wide_d_model}, {wide_rounds} rounds of {wide_steps} steps: / ddp (upper quartile)")
    for variant, entry in wide.items():
        print(f"{variant:>24} {entry['step_s']['median'] * 1e3:8.2f} ms {entry['over_ddp']['upper_quartile']:6.3f}")
    print(
        f"memory at d_model={held['ddp']['d_model']}, {held['ddp']['n_layers']} blocks, MB per rank (max over ranks): "
        "held by construction / at rest / peak"
    )
    for variant, entry in held.items():
        rest, peak = max(map(max, entry["rest_per_rank"])), max(map(max, entry["peak_per_rank"]))
        print(f"{variant:>24} {entry['held_bytes'] / 1e6:9.1f} / {rest / 1e6:9.1f} / {peak / 1e6:9.1f}  "
              f"peak / ddp {entry['peak_over_ddp']['max']:.3f}")  # fmt: skip
    config = {"rounds": rounds, "steps": steps, "variants": variants, "memory_d_model": held["ddp"]["d_model"],
              "memory_n_layers": held["ddp"]["n_layers"],
              "wide_d_model": wide_d_model, "wide_rounds": wide_rounds, "wide_steps": wide_steps,
              "quick": args.quick}  # fmt: skip
    result = {"machine": machine_info(), "config": config, "table": table, "wide": wide, "memory": held}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def _size(memory_entry: dict) -> str:
    """The model a memory row measured: its width, and its blocks where the row says (older results do not)."""
    blocks = memory_entry.get("n_layers")
    return f"d_model={memory_entry['d_model']}" + (f", {blocks} blocks" if blocks else "")


DATA_PARALLEL_LABELS = {
    "raw": "raw torch DDP loop", "zero1": "data_parallel zero_stage=1", "zero2": "data_parallel zero_stage=2",
    "torch_zero": "torch ZeroRedundancyOptimizer under ddp", "fp16": "data_parallel fp16 compression",
    "powersgd": "data_parallel PowerSGD", "fsdp": "model_parallel (FSDP2)",
    "lightning_model_parallel": "Lightning ModelParallelStrategy, same units",
}  # fmt: skip


STEP_TARGETS = {"zero1": 1.15}


PEER_TARGETS = {"zero1": 1.0, "fsdp": 1.02}


MEMORY_TARGETS = {"zero1": 0.80, "zero2": 0.65, "fsdp": 0.55}


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    table, wide, config = result["table"], result["wide"], result["config"]
    ratio = table["data_parallel"]["over_ddp"]
    floor = (
        "step time, data_parallel / ddp (2 processes; zero_stage=0 runs ddp's own code: this machine's noise floor, "
        "no target)"
    )
    rows = [summary_row("data_parallel_step", floor, ratio["median"], span_of(ratio), "x")]
    for widths, d_model in ((table, 32), (wide, config["wide_d_model"])):
        for variant, label in DATA_PARALLEL_LABELS.items():
            if variant not in widths:
                continue
            ratio, target = widths[variant]["over_ddp"], STEP_TARGETS.get(variant)
            measure = f"step time, {label} / ddp, d_model={d_model} (2 processes)"
            if "zero_ms_per_step" in widths[variant]:
                parts = ", ".join(f"{name} {ms:.2f}" for name, ms in widths[variant]["zero_ms_per_step"].items())
                step = widths["ddp"]["step_s"]["median"] * 1e3
                measure += f" (ZeRO's own ms a step: {parts}; ddp's step {step:.1f} ms)"
            rows.append(
                summary_row(
                    "data_parallel_step", measure, ratio["median"], span_of(ratio), "x", *verdict_of(ratio, target)
                )
            )
            peer = widths[variant].get("over_peer")
            if peer is not None and variant in PEER_TARGETS:
                measure = f"step time, {label} / {DATA_PARALLEL_LABELS[peer['peer']]}, d_model={d_model}"
                rows.append(summary_row("data_parallel_step", measure, peer["median"], span_of(peer), "x",
                                *verdict_of(peer, PEER_TARGETS[variant])))  # fmt: skip
    for variant, entry in result["memory"].items():
        if variant == "ddp":
            continue
        ratio, target = entry["peak_over_ddp"], MEMORY_TARGETS.get(variant)
        measure = (
            f"peak memory per rank in a step, {DATA_PARALLEL_LABELS[variant]} / ddp, {_size(entry)} "
            f"(held by construction: {entry['held_bytes'] / result['memory']['ddp']['held_bytes']:.2f})"
        )
        rows.append(
            summary_row("data_parallel_step", measure, ratio["median"], span_of(ratio), "x", *verdict_of(ratio, target))
        )
    for variant, entry in result["memory"].items():
        within = abs(entry["rest_over_held"] - 1) <= 0.10
        rows.append(summary_row("data_parallel_step", f"resident at the end of a step / held by construction, "
                        f"{DATA_PARALLEL_LABELS.get(variant, variant)}, {_size(entry)}",
                        entry["rest_over_held"], None, "x", "within 10 %", within))  # fmt: skip
    return rows


MEMORY_HEADER = ["variant", "held by construction", "resident at the end of a step", "peak in a step",
                 "peak / ddp, paired launches"]  # fmt: skip


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    table, wide, config = result["table"], result["wide"], result["config"]

    def timing(entries: dict) -> str:
        rows = [[f"`{variant}`", md_ms(entry["step_s"]), md_ratio(entry["over_ddp"]),
                 md_ratio(entry["over_peer"]) + f" (`{entry['over_peer']['peer']}`)" if "over_peer" in entry else "",
                 f"{entry['payload_bytes_per_step'] / 1e3:.0f}"] for variant, entry in entries.items()]  # fmt: skip
        return md_table(["variant", "ms per step", "/ ddp, paired", "/ peer, paired", "kB all-reduced per step"], rows)

    memory = [
        [f"`{variant}`", md_mb(entry["held_bytes"]), md_mb(max(map(max, entry["rest_per_rank"]))),
         md_mb(max(map(max, entry["peak_per_rank"]))), md_ratio(entry["peak_over_ddp"])]
        for variant, entry in result["memory"].items()
    ]  # fmt: skip
    ddp = result["memory"]["ddp"]
    width = f"{ddp['d_model']}" + (f", {ddp['n_layers']} blocks" if ddp.get("n_layers") else "")
    return (
        f"{config['rounds']} rounds of {config['steps']} steps, every variant in the same 2 processes:\n\n"
        f"{timing(table)}\n\nAt d_model={config['wide_d_model']}, {config['wide_rounds']} rounds of "
        f"{config['wide_steps']} steps:\n\n{timing(wide)}\n\n"
        f"Memory per rank at d_model={width}, training state only (the most of any rank, MB; held: parameters, "
        "gradients, optimizer state and reduction buffers; measured: less the same launch's runtime with the small "
        "model):\n\n" + md_table(MEMORY_HEADER, memory)
    )


if __name__ == "__main__":
    main()
