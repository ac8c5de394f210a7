"""The README's per-benchmark figures, generated from ``latest.json``'s results (``run.py`` writes them between the
``bench-summary`` markers), so that no figure in the README can drift from the run it comes from. Each function
turns one benchmark's result into Markdown: medians, with min-max where a spread was measured."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _ms(spread: dict[str, float]) -> str:
    return f"{spread['median'] * 1e3:.2f} ({spread['min'] * 1e3:.2f}-{spread['max'] * 1e3:.2f})"


def _s(spread: dict[str, float]) -> str:
    return f"{spread['median']:.2f} ({spread['min']:.2f}-{spread['max']:.2f})"


def _ratio(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})"


def _mb(value: float) -> str:
    return f"{value / 1e6:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def data_parallel(result: dict) -> str:
    table, wide, config = result["table"], result["wide"], result["config"]

    def timing(entries: dict) -> str:
        rows = [[f"`{variant}`", _ms(entry["step_s"]), _ratio(entry["over_ddp"]),
                 _ratio(entry["over_peer"]) + f" (`{entry['over_peer']['peer']}`)" if "over_peer" in entry else "",
                 f"{entry['payload_bytes_per_step'] / 1e3:.0f}"] for variant, entry in entries.items()]  # fmt: skip
        return _table(["variant", "ms per step", "/ ddp, paired", "/ peer, paired", "kB all-reduced per step"], rows)

    memory = [
        [f"`{variant}`", _mb(entry["held_bytes"]), _mb(max(map(max, entry["rest_per_rank"]))),
         _mb(max(map(max, entry["peak_per_rank"]))), _ratio(entry["peak_over_ddp"])]
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
        "model):\n\n" + _table(MEMORY_HEADER, memory)
    )


MEMORY_HEADER = ["variant", "held by construction", "resident at the end of a step", "peak in a step",
                 "peak / ddp, paired launches"]  # fmt: skip


def callback_overhead(result: dict) -> str:
    rows = []
    for entry in result["rows"]:
        breakdown = ", ".join(f"{name} {ms:.3f}" for name, ms in entry["breakdown_ms"].items())
        rows.append([str(entry["processes"]), str(entry["d_model"]), _ms(entry["step_s"]["stock"]),
                     _ms(entry["step_s"]["ours"]), _ratio(entry["ours_over_stock"]), breakdown])  # fmt: skip
    header = ["processes", "d_model", "stock ms per step", "ours ms per step", "ours / stock, paired",
              "hook ms per step, by callback (profiled fit)"]  # fmt: skip
    return f"{result['config']['rounds']} rounds of {result['config']['steps']} steps:\n\n" + _table(header, rows)


def checkpoint_async(result: dict) -> str:
    rows = []
    for size, entry in result["table"].items():
        sync, mine = entry["sync"], entry["async"]
        rows.append([f"{size} MB", _ms(sync["blocked_s"]), _ms(mine["blocked_s"]),
                     f"{sync['durable_s']['median']:.2f} / {mine['durable_s']['median']:.2f}",
                     f"{sync['lost_s']['median'] * 1e3:.0f} / {mine['lost_s']['median'] * 1e3:.0f}"])  # fmt: skip
    header = ["state", "sync: ms blocked per save", "async: ms blocked per save", "s until durable (sync / async)",
              "ms of fit lost per save (sync / async)"]  # fmt: skip
    return _table(header, rows)


def preemption(result: dict) -> str:
    steps = result["step_s"]
    durable = result["notice_to_durable_s"]
    return (
        f"ms per step without / with the vote: {_ms(steps['none'])} / {_ms(steps['vote'])}; SIGTERM to a durable "
        f"checkpoint of {result['ckpt_mb']:.0f} MB: {_s(durable)} s."
    )


def pipeline(result: dict) -> str:
    rows = [
        [str(r["width"]), str(r["microbatches"]), _ms(r["single_1t_s"]), _ms(r["raw_s"]), _ms(r["ours_s"]),
         _ratio(r["ours_over_raw_throughput"]), f"{r['ours_minus_raw_s']['median'] * 1e3:.2f}",
         f"{r['lightning_minus_raw_1p_s']['median'] * 1e3:.2f}",
         f"{r['bubble_theory']:.2f} / {r['bubble_measured_raw']:.2f} / {r['bubble_measured_ours']:.2f}"]
        for r in result["rows"]
    ]  # fmt: skip
    header = ["D", "m", "1 process ms", "raw ms", "ours ms", "ours / raw throughput, paired", "ours - raw ms",
              "Lightning - raw ms (1 process)", "bubble: theory / raw / ours"]  # fmt: skip
    memory = result["memory"]
    one, stages = memory["one_process"], memory["per_stage"]
    per_stage = ", ".join(f"{_mb(peak)} (holds {_mb(held)})" for peak, held in zip(stages["peak"], stages["held"],
                                                                                   strict=True))  # fmt: skip
    return (
        _table(header, rows) + f"\n\nPeak in a step at D={memory['width']}, m={memory['microbatches']}, MB: one "
        f"process {_mb(one['peak'][0])} (holds {_mb(one['held'][0])}); per stage {per_stage}."
    )


def resume(result: dict) -> str:
    table = result["table"]
    return (
        f"Process start to the first training step, {result['config']['state_mb']:.0f} MB state, s: fresh "
        f"{_s(table['fresh'])}, resumed from local disk {_s(table['local'])}, from S3 (moto on 127.0.0.1) "
        f"{_s(table['s3'])}."
    )


def checkpoint_cost(result: dict) -> str:
    table = result["table"]
    rows = [[variant, _ms(entry["step_s"]), _ms(entry["save_s"]) if variant != "none" else "-",
             f"{entry['ckpt_mb']['median']:.1f}" if variant != "none" else "-"]
            for variant, entry in table.items()]  # fmt: skip
    return _table(["variant", "ms per step (saves included)", "ms blocked per save", "MB per checkpoint"], rows)


def cost_levers(result: dict) -> str:
    rows = [[name, str(int(entry["steps"]["median"])), _s(entry["seconds"]), f"{entry['usd']['median']:.6f}"]
            for name, entry in result["table"].items()]  # fmt: skip
    return f"Billed as {result['config']['price']}:\n\n" + _table(["variant", "steps", "seconds", "USD"], rows)


def data_loading(result: dict) -> str:
    rows = []
    for r in result["rows"]:
        rate, first, cpu = r["samples_per_s"], r.get("first_batch_s"), r["training_process_cpu_s_per_epoch"]
        rows.append([
            str(r["world_size"]), r["workers"] + (", persistent" if r.get("persistent_workers") else ""),
            f"{rate['plain']['median']:.0f}",
            f"{rate['plain_forkserver']['median']:.0f}" if "plain_forkserver" in rate else "-",
            f"{rate['ours']['median']:.0f}",
            f"{first['plain']['median'] * 1e3:.0f} / {first['ours']['median'] * 1e3:.0f}" if first else "-",
            f"{cpu['plain']['median']:.2f} / {cpu['ours']['median']:.2f}",
        ])  # fmt: skip
    header = ["processes", "workers", "plain samples/s", "plain on ours' forkserver", "resumable samples/s",
              "ms to the first batch (plain / resumable)",
              "training process CPU s per epoch (plain / resumable)"]  # fmt: skip
    return _table(header, rows)


def sharded_checkpoint(result: dict) -> str:
    sharded, zero = result["table"]["model_parallel"], result["table"]["zero1"]
    rows = []
    for storage, where in (("local", "local disk"), ("s3", "S3 (moto on 127.0.0.1)")):
        sync, mine = sharded[storage]["sync"], sharded[storage]["async"]
        peak = max(sync["peak_rss_increase_bytes"], mine["peak_rss_increase_bytes"])
        rows.append([where, _ms(sync["blocked_s"]), _ms(mine["blocked_s"]),
                     f"{sync['durable_s']['median']:.2f} / {mine['durable_s']['median']:.2f}", _mb(peak)])  # fmt: skip
    header = ["storage", "sync: ms blocked per save", "async: ms blocked per save", "s until durable (sync / async)",
              "rank 0's peak increase, MB"]  # fmt: skip
    per_rank, consolidated = zero["per_rank"], zero["consolidated"]
    return (
        _table(header, rows) + f"\n\nZeRO-1, s per save: per-rank shares {_s(per_rank['save_s'])}, one consolidated "
        f"file {_s(consolidated['save_s'])}; rank 0's peak increase, MB: "
        f"{_mb(per_rank['peak_rss_increase_bytes']['median'])} against "
        f"{_mb(consolidated['peak_rss_increase_bytes']['median'])}."
    )


def hang_watchdog(result: dict) -> str:
    steps = result["step_s"]
    return "ms per step: " + ", ".join(f"{variant} {_ms(spread)}" for variant, spread in steps.items()) + "."


def goodput(result: dict) -> str:
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
        f"timeline: {totals}.\n\n" + _table(header, rows)
    )


DETAILS: dict[str, Callable[[dict[str, Any]], str]] = {
    "data_parallel_step": data_parallel,
    "callback_overhead": callback_overhead,
    "checkpoint_async": checkpoint_async,
    "preemption_cost": preemption,
    "pipeline_throughput": pipeline,
    "resume_time": resume,
    "checkpoint_cost": checkpoint_cost,
    "cost_levers": cost_levers,
    "data_loading": data_loading,
    "sharded_checkpoint": sharded_checkpoint,
    "hang_watchdog": hang_watchdog,
    "goodput": goodput,
}


def details(results: dict[str, dict]) -> str:
    """Every benchmark's figures, one paragraph or table each, in the order of ``DETAILS``."""
    parts = [f"**`{name}`**\n\n{DETAILS[name](results[name])}" for name in DETAILS if name in results]
    return "\n\n".join(parts)
