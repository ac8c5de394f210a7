"""`make bench`: every benchmark in one run, one summary table with each target and whether it holds, one JSON.

One method for every ratio with a target (``_common.py``): the variants alternate in the same processes (or in paired
launches where a process can only measure one, as a resident peak), their order rotated every round (with two: swapped);
each round gives one paired ratio, and a target is met when the bound of those ratios' spread meets it: the upper
quartile for a ``<=`` target, the lower quartile for a ``>=`` one (three rounds in four), never the median. A few rows
are judged stricter still, by every round (``sharded_checkpoint``). Comparisons of identical code are labelled noise
floors, without a target, and a target stated for a benchmark holds for every configuration it runs.

Each benchmark script writes its own JSON (``benchmarks/results/<name>.json``); this script runs them one after another,
never two at once, and writes ``benchmarks/results/latest.json``: the runs its rows come from (command, date, the
commit measured and the machine of each: an ``--only`` refresh is a run of its own, see :func:`merge_runs`), the
summary rows, and every script's full result. A run that leaves every benchmark with a result also rewrites the
README's summary table (:func:`readme_block`, between its ``bench-summary`` markers), which tests/test_readme.py checks
against ``latest.json``.

    .venv/bin/python benchmarks/run.py            # the full suite (about 70 min on 2 cores)
    .venv/bin/python benchmarks/run.py --quick    # a smoke run (under 4 min): small sizes, few repeats
    .venv/bin/python benchmarks/run.py --only callback_overhead    # re-measure one; its rows replace the last run's

CPU only: no benchmark here has a CUDA/nccl variant yet (memory at peak reads the allocator's peak on a GPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, meets, spread
from _readme_details import details

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE.parent / "README.md"
MARKERS = ("<!-- bench-summary -->", "<!-- /bench-summary -->")

Row = dict[str, Any]


def row(benchmark: str, measure: str, value: float, low_high: tuple[float, float] | None, unit: str,
        target: str | None = None, holds: bool | None = None) -> Row:  # fmt: skip
    """One summary line: ``value`` (``low_high`` = min-max over repeats) in ``unit``, its target and verdict."""
    figure = f"{value:.3g} {unit}".strip() if unit != "x" else f"{value:.3f}"
    if low_high is not None:
        figure += f" ({low_high[0]:.3g}-{low_high[1]:.3g})"
    return {"benchmark": benchmark, "measure": measure, "value": value, "figure": figure, "target": target,
            "holds": holds}  # fmt: skip


def _size(memory_entry: dict) -> str:
    """The model a memory row measured: its width, and its blocks where the row says (older results do not)."""
    blocks = memory_entry.get("n_layers")
    return f"d_model={memory_entry['d_model']}" + (f", {blocks} blocks" if blocks else "")


def _span(spread: dict[str, float]) -> tuple[float, float]:
    return spread["min"], spread["max"]


def _bound(ratio: dict[str, float], target: float, at_most: bool = True) -> str:
    """A target as the table states it, with the bound of the paired ratios' spread that decides it."""
    if at_most:
        return f"≤ {target} (upper quartile {ratio['upper_quartile']:.3f})"
    return f"≥ {target} (lower quartile {ratio['lower_quartile']:.3f})"


DATA_PARALLEL_LABELS = {
    "raw": "raw torch DDP loop", "zero1": "data_parallel zero_stage=1", "zero2": "data_parallel zero_stage=2",
    "torch_zero": "torch ZeroRedundancyOptimizer under ddp", "fp16": "data_parallel fp16 compression",
    "powersgd": "data_parallel PowerSGD", "fsdp": "model_parallel (FSDP2)",
    "lightning_model_parallel": "Lightning ModelParallelStrategy, same units",
}  # fmt: skip
STEP_TARGETS = {"zero1": 1.15}
PEER_TARGETS = {"zero1": 1.0, "fsdp": 1.02}
MEMORY_TARGETS = {"zero1": 0.80, "zero2": 0.65, "fsdp": 0.55}


def data_parallel_rows(result: dict) -> list[Row]:
    table, wide, config = result["table"], result["wide"], result["config"]
    ratio = table["data_parallel"]["over_ddp"]
    rows = [
        row("data_parallel_step", "step time, data_parallel / ddp (2 processes; zero_stage=0 runs ddp's own code: "
            "this machine's noise floor, no target)", ratio["median"], _span(ratio), "x"),
    ]  # fmt: skip
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
                row("data_parallel_step", measure, ratio["median"], _span(ratio), "x", *_verdict(ratio, target))
            )
            peer = widths[variant].get("over_peer")
            if peer is not None and variant in PEER_TARGETS:
                measure = f"step time, {label} / {DATA_PARALLEL_LABELS[peer['peer']]}, d_model={d_model}"
                rows.append(row("data_parallel_step", measure, peer["median"], _span(peer), "x",
                                *_verdict(peer, PEER_TARGETS[variant])))  # fmt: skip
    for variant, entry in result["memory"].items():
        if variant == "ddp":
            continue
        ratio, target = entry["peak_over_ddp"], MEMORY_TARGETS.get(variant)
        measure = (
            f"peak memory per rank in a step, {DATA_PARALLEL_LABELS[variant]} / ddp, {_size(entry)} "
            f"(held by construction: {entry['held_bytes'] / result['memory']['ddp']['held_bytes']:.2f})"
        )
        rows.append(row("data_parallel_step", measure, ratio["median"], _span(ratio), "x", *_verdict(ratio, target)))
    for variant, entry in result["memory"].items():
        within = abs(entry["rest_over_held"] - 1) <= 0.10
        rows.append(row("data_parallel_step", f"resident at the end of a step / held by construction, "
                        f"{DATA_PARALLEL_LABELS.get(variant, variant)}, {_size(entry)}",
                        entry["rest_over_held"], None, "x", "within 10 %", within))  # fmt: skip
    return rows


def _verdict(ratio: dict[str, float], target: float | None) -> tuple[str | None, bool | None]:
    """A ``<=`` target's text and verdict by the upper quartile of the paired ratios (``None``: no target)."""
    if target is None:
        return None, None
    return _bound(ratio, target), meets(ratio, target)


def callback_overhead_rows(result: dict) -> list[Row]:
    rows = []
    for entry in result["rows"]:
        ratio, stock_ms = entry["ours_over_stock"], entry["step_s"]["stock"]["median"] * 1e3
        top = ", ".join(f"{name} {ms:.2f}" for name, ms in list(entry["breakdown_ms"].items())[:3])
        measure = (
            f"step time, every lightning-scale callback of the command / stock ModelCheckpoint + EarlyStopping, "
            f"{entry['processes']} "
            f"process(es), {stock_ms:.1f} ms step (hook ms/step: {top})"
        )
        rows.append(row("callback_overhead", measure, ratio["median"], _span(ratio), "x",
                        _bound(ratio, entry["target"]), entry["holds"]))  # fmt: skip
    return rows


def checkpoint_async_rows(result: dict) -> list[Row]:
    rows = []
    for size, entry in result["table"].items():
        ratio = entry["async_over_sync_blocked"]
        rows.append(row("checkpoint_async", f"blocked time per save, async / sync, {size} MB", ratio["median"],
                        _span(ratio), "x", _bound(ratio, 0.1), entry["holds"]))  # fmt: skip
        lost = {variant: entry[variant]["lost_s"]["median"] for variant in ("sync", "async")}
        rows.append(row("checkpoint_async", f"fit time lost per save against no checkpoint, {size} MB, async "
                        f"(sync: {lost['sync']:.3g} s)", lost["async"], None, "s"))  # fmt: skip
    return rows


def preemption_rows(result: dict) -> list[Row]:
    durable = result["notice_to_durable_s"]
    return [
        row("preemption_cost", f"SIGTERM to rank 1 → durable checkpoint, {result['ckpt_mb']:.0f} MB (2 processes)",
            durable["median"], _span(durable), "s"),
        row("preemption_cost", "step time, SpotPreemption voting every step / none (2 processes)",
            result["vote_over_none"]["median"], _span(result["vote_over_none"]), "x",
            _bound(result["vote_over_none"], result["target"]), result["holds"]),
    ]  # fmt: skip


def pipeline_rows(result: dict) -> list[Row]:
    """Every width and microbatch count measured, each judged by the lower quartile of its paired rounds."""
    rows = []
    for entry in result["rows"]:
        width, m, ratio = entry["width"], entry["microbatches"], entry["ours_over_raw_throughput"]
        extra, stock = entry["ours_minus_raw_s"]["median"] * 1e3, entry["lightning_minus_raw_1p_s"]["median"] * 1e3
        measure = (f"throughput, pipeline_parallel / raw torch pipelining, D={width}, m={m}, 2 stages (ours - raw "
                   f"{extra:.2f} ms a step; stock Lightning - raw loop, 1 process: {stock:.2f} ms)")  # fmt: skip
        rows.append(row("pipeline_throughput", measure, ratio["median"], _span(ratio), "x",
                        _bound(ratio, 0.95, at_most=False), entry["holds"]))  # fmt: skip
        ideal, measured = 1 - entry["bubble_theory"], 1 - entry["bubble_measured_ours"]
        label = (
            f"parallel efficiency, (1 process / 2) / pipeline_parallel step, D={width}, m={m} (schedule's ideal "
            f"{ideal:.2f})"
        )
        rows.append(row("pipeline_throughput", label, measured, None, "x"))
    memory = result["memory"]
    one, stages = memory["one_process"], memory["per_stage"]
    held = max(stages["held"]) / one["held"][0]
    measure = (
        f"peak memory in a step, largest pipeline_parallel stage / one process training the whole model, "
        f"D={memory['width']}, m={memory['microbatches']} (parameters and gradients held: {held:.2f})"
    )
    rows.append(row("pipeline_throughput", measure, max(stages["peak"]) / one["peak"][0], None, "x"))
    return rows


def resume_rows(result: dict) -> list[Row]:
    table, mb = result["table"], result["config"]["state_mb"]
    return [
        row("resume_time", f"process start → first training step, {mb:.0f} MB state, {variant}",
            table[variant]["median"], _span(table[variant]), "s")
        for variant in ("fresh", "local")
    ]  # fmt: skip


def checkpoint_cost_rows(result: dict) -> list[Row]:
    ratio = result["ours_over_stock_save"]
    return [row("checkpoint_cost", "blocked time per save, ResumableCheckpoint / stock ModelCheckpoint (validated, "
                "atomic)", ratio["median"], _span(ratio), "x")]  # fmt: skip


def cost_levers_rows(result: dict) -> list[Row]:
    return [row("cost_levers", f"cost of one epoch, {name} / fp32", ratio["median"], _span(ratio), "x")
            for name, ratio in result["over_fp32"].items() if name != "fp32"]  # fmt: skip


def data_loading_rows(result: dict) -> list[Row]:
    rows = []
    for entry in result["rows"]:
        ratio = entry["ours_over_plain_throughput"]
        workers = entry["workers"] + (" persistent" if entry.get("persistent_workers") else "")
        label = f"data-loading throughput, resumable loader ({workers} workers) / plain DataLoader"
        target = f"≥ {result['target']} (lower quartile {ratio['lower_quartile']:.3f})"
        rows.append(row("data_loading", label, ratio["median"], _span(ratio), "x", target, entry["holds"]))
        for key, what in (("plain_forkserver_over_plain", "plain DataLoader on the resumable loader's forkserver / "
                           "plain DataLoader"), ("ours_over_plain_forkserver", "resumable loader / plain DataLoader, "
                           "both on that forkserver")):  # fmt: skip
            if f"{key}_throughput" in entry:
                part = entry[f"{key}_throughput"]
                rows.append(row("data_loading", f"data-loading throughput ({workers} workers), {what}",
                                part["median"], _span(part), "x"))  # fmt: skip
    return rows


def sharded_checkpoint_rows(result: dict) -> list[Row]:
    sharded, zero = result["table"]["model_parallel"], result["table"]["zero1"]
    full, own = sharded["memory"]["full_state_bytes"] / 1e6, sharded["memory"]["own_shard_bytes"] / 1e6
    blocked, memory = [], []
    for storage, where in (("local", "local disk"), ("s3", "S3")):
        ratio = sharded[storage]["async_over_sync_blocked"]  # paired per round; the target holds for every round
        blocked.append(row("sharded_checkpoint", f"blocked time per save, async / sync, model_parallel shards, "
                           f"{full:.0f} MB, {where} (2 processes)", ratio["median"], _span(ratio), "x",
                           f"≤ 0.1 (max {ratio['max']:.3f})", sharded[storage]["holds"]))  # fmt: skip
        peak = max(sharded[storage][variant]["peak_rss_increase_bytes"] for variant in ("sync", "async")) / 1e6
        label = f"rank-0 peak memory increase in a sharded save / its own shard ({own:.0f} of {full:.0f} MB), {where}"
        memory.append(row("sharded_checkpoint", label, peak / own, None, "x"))
    zero_rows = [
        row("sharded_checkpoint", f"{measure}, ZeRO-1 per-rank shares / consolidated file",
            zero[f"per_rank_over_consolidated_{key}"]["median"], _span(zero[f"per_rank_over_consolidated_{key}"]), "x")
        for key, measure in (("save_s", "save time"), ("peak_rss_increase", "rank-0 peak memory increase in a save"))
    ]  # fmt: skip
    return blocked + memory + zero_rows


def hang_watchdog_rows(result: dict) -> list[Row]:
    rows = []
    for variant, label in (("watchdog", "HangWatchdog"), ("watchdog+stragglers", "HangWatchdog + StragglerDetector")):
        ratio = result["over_none"][variant]
        own = f", the watchdog's own marks {result['marks_us_per_step']:.0f} µs/step" if variant == "watchdog" else ""
        rows.append(row("hang_watchdog", f"step time, {label} / none (paired per round, 2 processes{own})",
                        ratio["median"], _span(ratio), "x", f"≤ {result['target']} (upper quartile "
                        f"{ratio['upper_quartile']:.3f})", result["holds"][variant]))  # fmt: skip
    latency, config = result["detection"], result["config"]
    rows.append(row("hang_watchdog", f"{config['freeze']} of rank 1 → restarted job's first step, "
                    f"{latency['ckpt_mb']:.0f} MB state, min_timeout_s={config['min_timeout_s']:g} (exit after "
                    f"{latency['freeze_to_exit_s']:.1f} s, torchrun restart {latency['exit_to_restart_s']:.1f} s, "
                    f"first step {latency['restart_to_first_step_s']:.1f} s)", latency["freeze_to_first_step_s"],
                    None, "s"))  # fmt: skip
    return rows


def _recovered(rounds: list[dict], variant: str, kind: str) -> list[dict]:
    """Every recovered fault of ``kind`` in ``variant``'s runs."""
    return [f for r in rounds for f in r[variant]["faults"] if f["kind"] == kind and f.get("recovered")]


def goodput_rows(result: dict) -> list[Row]:
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
        rows.append(row("goodput", measure, firsts["median"], _span(firsts), "s", target, holds))
    values = {variant: spread([r[variant]["goodput"] for r in rounds]) for variant in rounds[0]}
    beside = ", ".join(f"{v} {g['median']:.3f}" for v, g in values.items() if v != "now")
    against = spread([r["now"]["goodput_vs_reference"] for r in rounds])["median"]
    verdict = verdicts["goodput, now"]
    target = f"≥ {verdict['target']} (lower quartile {verdict['bound']:.3f})"
    measure = (
        f"goodput at a fault every {result['config']['interval_s']:g} s, now, from its own timeline ({beside}; now "
        f"against stock's uninterrupted run, a launch of its own: {against:.3f})"
    )
    rows.append(row("goodput", measure, values["now"]["median"], _span(values["now"]), "x", target, verdict["holds"]))
    ratio, verdict = result["overhead"]["on_over_off"], verdicts["step time, snapshots auto / off"]
    cadence = sorted(set(result["overhead"]["snapshot_every_n_steps"]))
    measure = f"step time, memory snapshots auto (every {cadence} steps) / off, no fault, paired"
    rows.append(row("goodput", measure, ratio["median"], _span(ratio), "x", _bound(ratio, verdict["target"]),
                    verdict["holds"]))  # fmt: skip
    return rows


BENCHMARKS: dict[str, Callable[[dict], list[Row]]] = {
    "data_parallel_step": data_parallel_rows,
    "callback_overhead": callback_overhead_rows,
    "checkpoint_async": checkpoint_async_rows,
    "preemption_cost": preemption_rows,
    "pipeline_throughput": pipeline_rows,
    "resume_time": resume_rows,
    "checkpoint_cost": checkpoint_cost_rows,
    "cost_levers": cost_levers_rows,
    "data_loading": data_loading_rows,
    "sharded_checkpoint": sharded_checkpoint_rows,
    "hang_watchdog": hang_watchdog_rows,
    "goodput": goodput_rows,
}


def markdown(summary: list[Row]) -> str:
    """The summary as the README's Markdown table."""
    lines = ["| benchmark | measure | median (min-max) | target | holds |", "|---|---|---|---|---|"]
    for r in summary:
        verdict = "" if r["holds"] is None else ("yes" if r["holds"] else "**no**")
        lines.append(f"| `{r['benchmark']}` | {r['measure']} | {r['figure']} | {r['target'] or ''} | {verdict} |")
    return "\n".join(lines)


def readme_block(latest: dict[str, Any]) -> str:
    """What the README shows between its ``bench-summary`` markers: the table, each run its rows come from (command,
    date, commit, machine), then every benchmark's figures (``_readme_details.py``)."""
    lines = [markdown(latest["summary"]), "", "The rows come from these runs:", ""]
    for run in latest["runs"]:
        m = run["machine"]
        commit = f"at {run['commit']}" if run.get("commit") else f"recorded in {run['recorded_in']}"
        lines.append(
            f"- `{run['command']}` on {run['date']} {commit}: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
            f"torch {m['torch']}, Lightning {m['lightning']} ({', '.join(run['benchmarks'])})"
        )
    lines += ["", f"{sum(latest['seconds'].values()) / 60:.0f} min of benchmarks in all. Each benchmark's figures:"]
    return "\n".join(lines) + "\n\n" + details(latest["results"])


def merge_runs(earlier: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs behind the summary once ``run`` has replaced the rows of its benchmarks.

    Example:
        >>> full = {"command": "benchmarks/run.py", "benchmarks": ["a", "b"]}
        >>> only = {"command": "benchmarks/run.py --only b", "benchmarks": ["b"]}
        >>> [r["benchmarks"] for r in merge_runs(merge_runs([], full), only)]
        [['a'], ['b']]
        >>> [r["command"] for r in merge_runs([full, only], {**full, "command": "benchmarks/run.py"})]
        ['benchmarks/run.py']
    """
    kept = [{**r, "benchmarks": [b for b in r["benchmarks"] if b not in run["benchmarks"]]} for r in earlier]
    return [r for r in kept if r["benchmarks"]] + [run]


def _commit() -> str:
    """The checkout measured: its short commit, with ``+changes`` when tracked files differ from it."""
    try:
        git = ["git", "-C", str(HERE.parent)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = [*git, "status", "--porcelain", "--untracked-files=no"]
        changed = subprocess.run(status, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def update_readme(latest: dict[str, Any], readme: Path = README) -> None:
    """Replace the README's summary table with this run's."""
    text = readme.read_text()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    readme.write_text(f"{text[:start]}\n{readme_block(latest)}\n{text[end:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark's smoke mode (under 4 min)")
    parser.add_argument("--out", default=str(RESULTS / "latest.json"), help="where to write the summary JSON")
    parser.add_argument(
        "--only", nargs="*", choices=sorted(BENCHMARKS), help="run these only; their rows replace those in --out"
    )
    args = parser.parse_args()
    names = args.only or list(BENCHMARKS)

    command_line = " ".join(["benchmarks/run.py", *(arg for arg in sys.argv[1:] if not arg.startswith("--out"))])
    commit = _commit()  # before the run: it rewrites the tracked results it measures
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    previous = json.loads(Path(args.out).read_text()) if args.only and Path(args.out).exists() else None
    if previous is not None and previous["quick"] == args.quick:  # --only refreshes those rows of the last run
        results, seconds, runs = previous["results"], previous["seconds"], previous["runs"]
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:  # one at a time: concurrent benchmarks would measure each other
            out = Path(scratch if args.quick else RESULTS) / f"{name}.json"
            command = [sys.executable, str(HERE / f"{name}.py"), f"--out={out}", *(["--quick"] if args.quick else [])]
            print(f"\n=== {name}: {' '.join(command[1:])}", flush=True)
            started = time.monotonic()
            subprocess.run(command, check=True)
            seconds[name] = time.monotonic() - started
            results[name] = json.loads(out.read_text())
    summary = [r for name in BENCHMARKS if name in results for r in BENCHMARKS[name](results[name])]

    print(f"\nlightning-scale benchmarks{' (quick: smoke sizes, not for comparison)' if args.quick else ''}")
    width = max(len(r["measure"]) for r in summary)
    for r in summary:
        verdict = "" if r["holds"] is None else ("holds" if r["holds"] else "MISSED")
        print(f"{r['benchmark']:<20} {r['measure']:<{width}} {r['figure']:>24} {r['target'] or '':>7} {verdict}")
    machine = machine_info()
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
          f"lightning {machine['lightning']}; {sum(seconds.values()) / 60:.1f} min")  # fmt: skip
    run = {"command": command_line, "date": time.strftime("%Y-%m-%d"), "commit": commit, "machine": machine,
           "benchmarks": names}  # fmt: skip
    latest = {
        "runs": merge_runs(runs, run),
        "quick": args.quick,
        "seconds": seconds,
        "summary": summary,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(latest, indent=1))
    print(f"wrote {args.out}")
    if not args.quick and set(results) == set(BENCHMARKS) and Path(args.out) == RESULTS / "latest.json":  # --only too
        update_readme(latest)
        print(f"updated the summary table in {README}")


if __name__ == "__main__":
    main()
