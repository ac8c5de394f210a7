"""Goodput under failures: the same 2-process CPU job (a user's MLP and torch ``DataLoader``, ~200 MB of training
state) under one seeded fault trace, as stock Lightning, as lightning-scale before memory snapshots and warm restarts,
and as lightning-scale now.

The job runs as two simulated nodes (``_goodput_cluster.py``: one torchrun agent each on 127.0.0.1, one process
per node, c10d rendezvous, ``--max-restarts 100``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), each with a memory of
its own (``LIGHTNING_SCALE_SNAPSHOT_DIR``), and is compared with

- ``stock``: a plain Lightning script, ``ModelCheckpoint(every_n_train_steps=K, save_last=True)``,
  ``trainer.fit(ckpt_path="last")`` (``_goodput_job.py``);
- ``before``: ``python -m lightning_scale fit`` with ``--checkpoint.snapshot_every_n_steps null`` and
  ``LIGHTNING_SCALE_WARM_RESTARTS=0``: durable checkpoints, torchrun's restarts;
- ``now``: ``python -m lightning_scale fit`` with its defaults: memory snapshots ``"auto"``, warm restarts.

All take a durable checkpoint every K steps (``Config.every``: near the Young/Daly interval of a ~1 s save and one
fault a minute, the cadence that serves the durable-only variants best). The fault trace and what the driver does
where a job does not act by itself are in ``_goodput_trace.py``: one fault a minute, the kinds in turn (SIGKILL of a
rank's training process, under warm restarts the child that trains, not its parent; a SIGTERM notice to a rank;
a SIGSTOP freeze; a node lost, its memory with it, a new agent started in its place at once).

Goodput is the uninterrupted time for the steps reached over the wall time, both from the launch to the end of that
step. The uninterrupted time comes from the run's own timeline (its first attempt's start, then every step that
counted at the run's own step time), so that only what faults cost is lost; beside it, the same against stock
Lightning's uninterrupted run, a launch of its own minutes away, which also counts any difference of step time between
the jobs (on this shared machine the step time of one job moves by tens of percent between runs minutes apart: see
``_goodput_analysis.goodput``). lightning-scale's per-step costs are measured on their own, paired: the snapshots' here,
every callback's in ``callback_overhead.py``. Every run is also checked bitwise (rank 0's final weights) against the
uninterrupted run of its own kind. Per fault: detection, restart, state load, steps replayed
(``_goodput_analysis.py``). With more than one round the variants' order is rotated. Snapshot overhead: blocks of
steps with snapshots ``"auto"`` and off alternate within one fit of the same two processes, on the same two simulated
nodes as the goodput runs (so each snapshot is also copied to the other node), paired per pair of blocks (seconds
apart: fits a minute apart differed by ±10 % here with no change at all), judged by the upper quartile.

Prints the tables and writes ``benchmarks/results/goodput.json``.

    .venv/bin/python -m benchmarks.goodput [--quick] [--keep DIR] [--interval-s S]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any

import torch

from benchmarks._common import machine_info, meets, paired_ratios, rotated, spread
from benchmarks._goodput_analysis import fault_breakdown, goodput
from benchmarks._goodput_cluster import RENDEZVOUS_CONF, ROOT, Cluster
from benchmarks._goodput_trace import drive, trace
from benchmarks._summary import (
    Row,
    bound_text,
    md_table,
    span_of,
    summary_row,
)

VARIANTS = ("stock", "before", "now")
FIRST_STEP_TARGETS_S = {"SIGKILL": 3.0, "node": 5.0, "SIGSTOP": 15.0}
GOODPUT_TARGET = 0.95
OVERHEAD_TARGET = 1.02


@dataclass(frozen=True)
class Config:
    width: int
    depth: int
    interval_s: float
    faults: int
    rounds: int
    every: int
    overhead_pairs: int  # pairs of blocks of steps with snapshots on and off, in one fit
    overhead_block: int  # the fewest steps of a block (a whole number of the cadence "auto" chose)
    overhead_warmup: int  # steps before the first block: the first snapshots allocate, "auto" measures its costs
    variants: tuple[str, ...] = VARIANTS
    seed: int = 0


FULL = Config(width=2048, depth=4, interval_s=60.0, faults=4, rounds=1, every=50, overhead_pairs=16, overhead_block=42,
              overhead_warmup=600)  # fmt: skip
QUICK = Config(width=256, depth=2, interval_s=1.5, faults=4, rounds=1, every=10, overhead_pairs=1, overhead_block=5,
               overhead_warmup=5, variants=("now",))  # fmt: skip


def _environment(variant: str) -> dict[str, str]:
    # LOGLEVEL=INFO: torchrun says when it restarts workers and when a node's workers finished
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "LOGLEVEL": "INFO", "PYTHONPATH": str(ROOT)}  # fmt: skip
    if variant == "before":
        env["LIGHTNING_SCALE_WARM_RESTARTS"] = "0"
    return env


def _target(variant: str, config: Config, steps: int, workdir: Path) -> list[str]:
    """What each agent runs."""
    model = [f"--width={config.width}", f"--depth={config.depth}"]
    if variant == "stock":
        return ["-m", "benchmarks._goodput_job", "stock", f"--out-dir={workdir}", f"--steps={steps}",
                f"--ckpt-dir={workdir / 'ckpt'}", f"--every={config.every}", *model]  # fmt: skip
    command = [
        "-m", "lightning_scale", "fit", "--model=benchmarks._goodput_job.GoodputMLP", f"--model.width={config.width}",
        f"--model.depth={config.depth}", "--data=benchmarks._goodput_job.GoodputData", "--seed_everything=0",
        "--trainer.accelerator=cpu", "--trainer.devices=1", f"--trainer.max_steps={steps}", "--trainer.logger=false",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={workdir}", "--trainer.callbacks+=benchmarks._goodput_job.StepRecords",
        f"--trainer.callbacks.out_dir={workdir}", f"--checkpoint.dirpath={workdir / 'ckpt'}",
        f"--checkpoint.every_n_train_steps={config.every}", "--cost.price_per_hour=1.0",
    ]  # fmt: skip
    return [*command, "--checkpoint.snapshot_every_n_steps=null"] if variant == "before" else command


def run_job(variant: str, config: Config, steps: int, faults: list[dict[str, Any]], workdir: Path,
            memory: Path) -> dict[str, Any]:  # fmt: skip
    """One run of the job under ``faults``: its records, output lines, injected faults and final weights."""
    workdir.mkdir(parents=True)
    cluster = Cluster(_target(variant, config, steps, workdir), _environment(variant), workdir, memory)
    budget_s = 600.0 + 6 * config.interval_s * (config.faults + 1)
    cluster.start()
    try:
        injected = drive(cluster, faults, config.interval_s, steps, time.time() + budget_s, variant)
    finally:
        cluster.stop()
    final = workdir / "final_rank0.pt"
    return {"variant": variant, "launched": cluster.launched, "records": cluster.records(),
            "lines": cluster.lines(), "faults": injected, "exit_codes": cluster.exit_codes(),
            "final": torch.load(final, weights_only=True) if final.exists() else None}  # fmt: skip


def bitwise_equal(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> bool:
    return a is not None and b is not None and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def overhead(config: Config, workdir: Path, memory: Path) -> list[dict[str, Any]]:
    """Blocks of steps with memory snapshots ``"auto"`` and off, in turn, in one fit of two processes, one on each
    simulated node (``_goodput_job.SnapshotBlocks``): per pair of blocks, their mean step times."""
    out = workdir / "overhead.json"
    target = ["-m", "benchmarks._goodput_job", "overhead", f"--out-dir={workdir}",
              f"--pairs={config.overhead_pairs}", f"--block={config.overhead_block}", f"--width={config.width}",
              f"--depth={config.depth}", f"--warmup={config.overhead_warmup}", f"--out={out}"]  # fmt: skip
    cluster = Cluster(target, _environment("now"), workdir, memory)
    cluster.start()
    deadline = time.time() + 1800
    try:
        while not cluster.finished():
            if time.time() > deadline:
                raise RuntimeError(f"the snapshot overhead fits did not end in time; see {workdir}")
            time.sleep(0.5)
    finally:
        cluster.stop()
    if not out.exists() or set(cluster.exit_codes().values()) != {0}:
        raise RuntimeError(f"the snapshot overhead fits failed ({cluster.exit_codes()}); see {workdir}")
    return json.loads(out.read_text())


def summarize(runs: list[dict[str, dict[str, Any]]], references: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per round and variant: goodput, bitwise equality and every fault's breakdown."""
    rounds = []
    for per_variant in runs:
        entry = {}
        for variant, run in per_variant.items():
            own = references["stock" if variant == "stock" else "now"]
            breakdowns = [fault_breakdown(f, run["records"], run["lines"], run["launched"]) for f in run["faults"]]
            entry[variant] = {
                **goodput(run, references["stock"]),
                "bitwise_equal": bitwise_equal(run["final"], own["final"]),
                "exit_codes": run["exit_codes"],
                "faults": breakdowns,
            }
        rounds.append(entry)
    return {"rounds": rounds}


def _per_kind(rounds: list[dict[str, Any]], variant: str, kind: str, key: str) -> list[float]:
    return [f[key] for r in rounds for f in r[variant]["faults"] if f["kind"] == kind and f.get("recovered")]


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue with its bound: the upper quartile of the values for a ``<=`` target, the lower for a
    ``>=`` one (the value itself when there is one)."""
    rounds, verdicts = result["rounds"], []
    for kind, target in FIRST_STEP_TARGETS_S.items():
        values = _per_kind(rounds, "now", kind, "first_resumed_step_s")
        if values:
            ratios = paired_ratios(values)
            verdicts.append({"measure": f"{kind} → first resumed step, now", "values": values, "target": target,
                             "bound": ratios["upper_quartile"], "holds": meets(ratios, target)})  # fmt: skip
    values = [r["now"]["goodput"] for r in rounds]  # from the run's own timeline
    ratios = paired_ratios(values)
    holds = meets(ratios, GOODPUT_TARGET, at_most=False)
    verdicts.append({"measure": "goodput, now", "values": values, "target": GOODPUT_TARGET,
                     "bound": ratios["lower_quartile"], "holds": holds})  # fmt: skip
    ratio = result["overhead"]["on_over_off"]
    verdicts.append({"measure": "step time, snapshots auto / off", "values": [], "target": OVERHEAD_TARGET,
                     "bound": ratio["upper_quartile"], "holds": meets(ratio, OVERHEAD_TARGET)})  # fmt: skip
    return verdicts


def _reference(run: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """An uninterrupted run's figures: wall time to its last step, median step time, checkpoint size."""
    ends = sorted(r["t"] for r in run["records"] if r["event"] == "step" and r["rank"] == 0)
    sizes = [p.stat().st_size for p in (workdir / "ckpt").rglob("*") if p.is_file()]
    return {"wall_s": ends[-1] - run["launched"], "first_step_s": ends[0] - run["launched"],
            "step_s": spread([b - a for a, b in itertools.pairwise(ends)])["median"],
            "ckpt_mb": max(sizes, default=0) / 1e6, "exit_codes": run["exit_codes"]}  # fmt: skip


def measure(config: Config, scratch: Path) -> dict[str, Any]:
    memory = Path("/dev/shm") / f"goodput-{uuid.uuid4().hex[:8]}"
    try:
        (scratch / "overhead").mkdir()
        per_round = overhead(config, scratch / "overhead", memory / "overhead")
        step_s = median([r["off"]["step_s"] for r in per_round])
        steps = math.ceil((config.faults + 0.5) * config.interval_s / step_s)
        faults = trace(config.faults, config.seed)
        print(f"goodput: {steps} steps of ~{step_s * 1e3:.0f} ms, {config.faults} faults every "
              f"{config.interval_s:g} s, durable checkpoint every {config.every} steps", flush=True)  # fmt: skip
        references, reference_runs = {}, {}
        for variant in ("stock", "now"):
            workdir = scratch / f"uninterrupted-{variant}"
            reference_runs[variant] = run_job(variant, config, steps, [], workdir, memory / f"u-{variant}")
            references[variant] = _reference(reference_runs[variant], workdir)
            shutil.rmtree(workdir / "ckpt", ignore_errors=True)
        runs = []
        for index in range(config.rounds):
            per_variant = {}
            for variant in rotated(config.variants, index):
                workdir = scratch / f"{index}-{variant}"
                per_variant[variant] = run_job(variant, config, steps, faults, workdir, memory / f"{index}-{variant}")
                shutil.rmtree(workdir / "ckpt", ignore_errors=True)
            runs.append(per_variant)
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    result = summarize(runs, reference_runs)
    ratios = [r["on"]["step_s"] / r["off"]["step_s"] for r in per_round]
    result.update(
        config={**asdict(config), "steps": steps, "rendezvous_conf": RENDEZVOUS_CONF, "trace": faults},
        uninterrupted=references,
        overhead={"per_round": per_round, "on_over_off": paired_ratios(ratios),
                  "snapshot_every_n_steps": [r["on"]["snapshot_every_n_steps"] for r in per_round],
                  "snapshot_s": [r["on"]["snapshot_s"] for r in per_round]},
    )  # fmt: skip
    result["targets"] = judge(result)
    return result


def _fault_line(variant: str, fault: dict[str, Any]) -> str:
    who = f"rank {fault['rank']}" if fault["rank"] is not None else f"node b (ranks {fault.get('ranks_lost')})"
    head = f"  {variant:<7} {fault['kind']:<8} {who:<22} at {fault['at_s']:6.1f} s"
    if not fault.get("recovered"):
        return head + "  not recovered"
    ended, again = fault.get("ended_by_driver_s"), fault.get("resubmitted_s")
    driver = "" if ended is None else f" (the driver SIGKILLed it after {ended:.0f} s)"
    driver += "" if again is None else f" (the job ended unfinished; the driver resubmitted it after {again:.0f} s)"
    return (
        f"{head}  detection {fault['detection_s']:5.1f} s, restart {fault['restart_s']:5.1f} s, load "
        f"{fault['load_s']:5.1f} s (read {fault['read_s']:.1f}, prepare {fault['prepare_s']:.1f}, step "
        f"{fault['step_s']:.1f}) -> first resumed step {fault['first_resumed_step_s']:5.1f} s; "
        f"{fault['steps_replayed']} steps replayed, from {fault['resumed_from']}{driver}"
    )


def report(result: dict[str, Any]) -> None:
    config, references = result["config"], result["uninterrupted"]
    print(
        f"goodput, 2 nodes x 1 process (gloo), {references['stock']['ckpt_mb']:.0f} MB checkpoint, "
        f"{config['steps']} steps, a fault every {config['interval_s']:g} s, {config['rounds']} round(s)"
    )
    for variant, ref in references.items():
        print(f"  uninterrupted {variant}: {ref['wall_s']:.1f} s ({ref['step_s'] * 1e3:.0f} ms a step, first step "
              f"after {ref['first_step_s']:.1f} s)")  # fmt: skip
    for index, per_variant in enumerate(result["rounds"]):
        for variant, entry in per_variant.items():
            equal = ("bitwise equal" if entry["bitwise_equal"] else "NOT bitwise equal") + " to its uninterrupted run"
            wall = entry["wall_s"] or float("nan")
            print(f"  round {index} {variant:<7} goodput {entry['goodput']:.3f} (against stock's uninterrupted run "
                  f"{entry['goodput_vs_reference']:.3f}; {entry['steps']} steps in {wall:.1f} s; {equal})")  # fmt: skip
            for fault in entry["faults"]:
                print(_fault_line(variant, fault))
    ratio = result["overhead"]["on_over_off"]
    print(f"  snapshots auto / off, step time, paired: median {ratio['median']:.3f}, upper quartile "
          f"{ratio['upper_quartile']:.3f} (every {result['overhead']['snapshot_every_n_steps']} steps)")  # fmt: skip
    for target in result["targets"]:
        verdict = "holds" if target["holds"] else "MISSED"
        print(f"  target {target['measure']}: {target['bound']:.3f} vs {target['target']} {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small state, a fault every 1.5 s, now only beside stock's uninterrupted run (smoke test)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "goodput.json"))
    parser.add_argument("--keep", help="keep the runs' records and logs in this folder")
    parser.add_argument("--interval-s", type=float, help="seconds between faults instead of the mode's (development)")
    args = parser.parse_args()
    config = QUICK if args.quick else FULL
    if args.interval_s is not None:
        config = replace(config, interval_s=args.interval_s)
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="goodput-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        result = measure(config, scratch)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    result = {"machine": machine_info(), "quick": args.quick, **result}
    report(result)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def _recovered(rounds: list[dict], variant: str, kind: str) -> list[dict]:
    """Every recovered fault of ``kind`` in ``variant``'s runs."""
    return [f for r in rounds for f in r[variant]["faults"] if f["kind"] == kind and f.get("recovered")]


def rows(result: dict) -> list[Row]:
    """Per fault kind, the first resumed step (now, the others beside it); goodput; the snapshots' cost, no fault."""
    rounds, verdicts = result["rounds"], {target["measure"]: target for target in result["targets"]}
    mb, rows = result["uninterrupted"]["stock"]["ckpt_mb"], []
    for kind in ("SIGKILL", "SIGTERM", "SIGSTOP", "node"):
        now = _recovered(rounds, "now", kind)
        if not now:
            continue
        firsts = spread([f["first_resumed_step_s"] for f in now])
        parts = {key: spread([f[key] for f in now])["median"] for key in ("detection_s", "restart_s", "load_s")}
        others = [(v, [f["first_resumed_step_s"] for f in _recovered(rounds, v, kind)]) for v in rounds[0]]
        beside = ", ".join(f"{v} {spread(values)['median']:.1f} s" for v, values in others if v != "now" and values)
        measure = (
            f"{kind} → first resumed step, {mb:.0f} MB state, now (detection {parts['detection_s']:.1f} s, restart "
            f"{parts['restart_s']:.1f} s, load {parts['load_s']:.1f} s; at most "
            f"{max(f['steps_replayed'] for f in now)} step(s) replayed; {beside})"
        )
        verdict = verdicts.get(f"{kind} → first resumed step, now")
        target = None if verdict is None else f"≤ {verdict['target']} s (upper quartile {verdict['bound']:.2f})"
        holds = None if verdict is None else verdict["holds"]
        rows.append(summary_row("goodput", measure, firsts["median"], span_of(firsts), "s", target, holds))
    values = {variant: spread([r[variant]["goodput"] for r in rounds]) for variant in rounds[0]}
    beside = ", ".join(f"{v} {g['median']:.3f}" for v, g in values.items() if v != "now")
    against = spread([r["now"]["goodput_vs_reference"] for r in rounds])["median"]
    verdict = verdicts["goodput, now"]
    target = f"≥ {verdict['target']} (lower quartile {verdict['bound']:.3f})"
    measure = (
        f"goodput at a fault every {result['config']['interval_s']:g} s, now, from its own timeline ({beside}; now "
        f"against stock's uninterrupted run, a launch of its own: {against:.3f})"
    )
    rows.append(
        summary_row("goodput", measure, values["now"]["median"], span_of(values["now"]), "x", target, verdict["holds"])
    )
    ratio, verdict = result["overhead"]["on_over_off"], verdicts["step time, snapshots auto / off"]
    cadence = sorted(set(result["overhead"]["snapshot_every_n_steps"]))
    measure = f"step time, memory snapshots auto (every {cadence} steps) / off, no fault, paired"
    target = bound_text(ratio, verdict["target"])
    rows.append(summary_row("goodput", measure, ratio["median"], span_of(ratio), "x", target, verdict["holds"]))
    return rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    config, references = result["config"], result["uninterrupted"]
    rows = []
    for index, per_variant in enumerate(result["rounds"]):
        for variant, entry in per_variant.items():
            for fault in entry["faults"]:
                who = f"rank {fault['rank']}" if fault["rank"] is not None else "node b"
                if not fault.get("recovered"):
                    rows.append([str(index), f"`{variant}`", f"{fault['kind']} ({who})", *["not recovered"] * 5])
                    continue
                rows.append([str(index), f"`{variant}`", f"{fault['kind']} ({who})", f"{fault['detection_s']:.1f}",
                             f"{fault['restart_s']:.1f}", f"{fault['load_s']:.1f}",
                             f"{fault['first_resumed_step_s']:.1f}",
                             f"{fault['steps_replayed']} ({fault['resumed_from']})"])  # fmt: skip
    header = ["round", "variant", "fault", "detection s", "restart s", "state load s", "first resumed step s",
              "steps replayed (resumed from)"]  # fmt: skip
    totals = "; ".join(
        f"`{variant}` {entry['goodput']:.3f} (against stock's uninterrupted run {entry['goodput_vs_reference']:.3f}; "
        f"{'bitwise equal' if entry['bitwise_equal'] else 'not bitwise equal'} to its own)"
        for per_variant in result["rounds"] for variant, entry in per_variant.items()
    )  # fmt: skip
    ref = references["stock"]
    return (
        f"{config['steps']} steps of {ref['step_s'] * 1e3:.0f} ms ({ref['ckpt_mb']:.0f} MB checkpoint), a fault every "
        f"{config['interval_s']:g} s, a durable checkpoint every {config['every']} steps; goodput, from each run's own "
        f"timeline: {totals}.\n\n" + md_table(header, rows)
    )


if __name__ == "__main__":
    main()
