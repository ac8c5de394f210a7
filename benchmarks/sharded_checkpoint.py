"""Sharded checkpoints on 2 processes (torchrun, gloo, CPU): what training waits for, and rank 0's memory.

1. ``model_parallel`` (FSDP2) on a stack of Linear layers whose state (fp32 weights + Adam's two moments) weighs
   ~500 MB, every rank writing its own shards: synchronous vs ``async_save=True``, each on local disk and on an
   S3-protocol server (moto, on 127.0.0.1, started here; a fresh bucket). Per save: the time training waited (the
   slowest rank), the time until durable (manifest published), and the paired ratio async / sync of the blocked time
   in each round. Target: async / sync <= 0.1, judged by the largest per-round ratio of the worse storage.
2. Rank 0's peak resident memory during each of those saves (sampled every 2 ms, background write included) above
   its RSS just before the save, next to the bytes of rank 0's own shard and of the full state: a save that gathered
   the full state would add at least the other rank's shard.
3. ``data_parallel`` with ``zero_stage=1`` on the same state: each rank saving its own share of the optimizer state
   (``sharded=True``, the default) vs one file consolidated on rank 0 (``sharded=False``): save time and rank 0's
   peak memory, paired per round.

All variants of a part are saved by the same two processes at the same steps (one ``ResumableCheckpoint`` each, their
own triggers off), after a warm-up round, in an order reversed every round (ABBA); each save lands before the next
starts. Times come from a launch with the default allocator. Memory comes from a second, shorter launch of each part
with ``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB: by default glibc serves allocations below its (rising) threshold from
freed memory that the RSS already counts, so a save could allocate hundreds of MB, even gather the state, unseen;
fixed, every allocation of 1 MiB or more is a fresh mapping that the RSS counts, returned when freed. That launch's
blocked times (every host copy faulting in fresh pages) are reported too, not judged. Prints a table and writes
``benchmarks/results/sharded_checkpoint.json``.

    .venv/bin/python -m benchmarks.sharded_checkpoint [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import MEMORY_ENV, machine_info, spread
from benchmarks._summary import (
    Row,
    md_mb,
    md_ms,
    md_s,
    md_table,
    span_of,
    summary_row,
)
from benchmarks.resume_time import s3_server
from lightning_scale.testing import launch_command, launch_environment

ROOT = Path(__file__).resolve().parents[1]
JOB = "benchmarks._sharded_checkpoint_job"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.1  # async / sync blocked time per save, every round
MB = 1e6


def run_job(part: str, dirs: dict[str, str], size: dict[str, int], env: dict[str, str], workdir: Path) -> dict:
    """One torchrun launch of 2 processes that saves every variant of ``part`` in each directory of ``dirs``."""
    out = workdir / f"{part}-{uuid.uuid4().hex[:8]}.json"
    job = ["-m", JOB, f"--part={part}", f"--out={out}", *(f"--{key}={value}" for key, value in size.items())]
    job += [f"--dir={label}={dirpath}" for label, dirpath in dirs.items()]
    done = subprocess.run(
        launch_command(job, 2), env=launch_environment([ROOT], **env), capture_output=True, text=True, timeout=1200
    )
    if done.returncode != 0:
        raise RuntimeError(f"{part} job failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return json.loads(out.read_text())


def measured(result: dict, storage: str, variant: str, key: str) -> list[float]:
    """``key`` of each measured (not warm-up) save of ``variant`` in ``storage``, in round order."""
    saves = [s for s in result["saves"] if not s["warmup"] and (s["storage"], s["variant"]) == (storage, variant)]
    return [s[key] for s in sorted(saves, key=lambda s: s["round"])]


def warmup_peak(result: dict, storage: str, variant: str) -> int:
    """Rank 0's RSS increase in the warm-up save of ``variant`` in ``storage`` (first-time allocations: the host
    buffers of ``async_save``, the S3 client)."""
    return next(
        s["peak_increase"]
        for s in result["saves"]
        if s["warmup"] and (s["storage"], s["variant"]) == (storage, variant)
    )


PAGE_BYTES = 4096  # the resolution of a resident-memory increase: a smaller one reads as 0


def paired(numerators: list[float], denominators: list[float]) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {"per_round": ratios, **spread(ratios)}


def model_parallel_table(timing: dict, memory: dict, storages: list[str]) -> dict[str, Any]:
    """Times from the ``timing`` launch, rank 0's memory from the ``memory`` launch (see the docstring)."""
    table: dict[str, Any] = {}
    for storage in storages:
        entry: dict[str, Any] = {
            variant: {
                "blocked_s": spread(measured(timing, storage, variant, "blocked_s")),
                "durable_s": spread(measured(timing, storage, variant, "durable_s")),
                "peak_rss_increase_bytes": max(measured(memory, storage, variant, "peak_increase")),
                "peak_rss_increase_bytes_warmup": warmup_peak(memory, storage, variant),
                "blocked_s_memory_launch": spread(measured(memory, storage, variant, "blocked_s")),
                "checkpoint_bytes": timing["checkpoint_bytes"].get(f"{storage}/{variant}"),
            }
            for variant in ("sync", "async")
        }
        ratio = paired(measured(timing, storage, "async", "blocked_s"), measured(timing, storage, "sync", "blocked_s"))
        entry["async_over_sync_blocked"] = ratio
        entry["holds"] = ratio["max"] <= TARGET
        entry["async_over_sync_blocked_memory_launch"] = paired(
            measured(memory, storage, "async", "blocked_s"), measured(memory, storage, "sync", "blocked_s")
        )
        table[storage] = entry
    worst = max(storages, key=lambda s: table[s]["async_over_sync_blocked"]["max"])
    own, full = memory["bytes"]["own_shard"], memory["bytes"]["full_state"]
    largest, first = (
        max(table[s][v][key] for s in storages for v in ("sync", "async"))
        for key in ("peak_rss_increase_bytes", "peak_rss_increase_bytes_warmup")
    )
    table["worst_storage"] = worst
    table["holds"] = table[worst]["holds"]
    table["memory"] = {
        "own_shard_bytes": own,
        "full_state_bytes": full,
        "peak_rss_increase_bytes": largest,
        "peak_over_own_shard": largest / own,
        "peak_over_full_state": largest / full,
        "warmup_peak_rss_increase_bytes": first,
        "warmup_peak_over_own_shard": first / own,
    }
    return table


def zero1_table(timing: dict, memory: dict) -> dict[str, Any]:
    """Save times from the ``timing`` launch, rank 0's memory from the ``memory`` launch."""
    variants = ("per_rank", "consolidated")
    table: dict[str, Any] = {
        variant: {
            "save_s": spread(measured(timing, "local", variant, "blocked_s")),
            "peak_rss_increase_bytes": spread(measured(memory, "local", variant, "peak_increase")),
            "peak_rss_increase_bytes_warmup": warmup_peak(memory, "local", variant),
            "checkpoint_bytes": timing["checkpoint_bytes"].get(f"local/{variant}"),
        }
        for variant in variants
    }
    for result, key, name in ((timing, "blocked_s", "save_s"), (memory, "peak_increase", "peak_rss_increase")):
        per_rank, consolidated = (measured(result, "local", variant, key) for variant in variants)
        if key == "peak_increase":  # one page at least: --quick's small states can raise the peak by nothing visible
            consolidated = [max(value, PAGE_BYTES) for value in consolidated]
        table[f"per_rank_over_consolidated_{name}"] = paired(per_rank, consolidated)
    table["own_shard_bytes"], table["full_state_bytes"] = memory["bytes"]["own_shard"], memory["bytes"]["full_state"]
    return table


def _mb(value: float) -> str:
    return f"{value / MB:.1f}"


def _span(values: dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
    """``median (min-max)`` of a spread, times ``scale``."""
    low, middle, high = (f"{values[key] * scale:.{digits}f}" for key in ("min", "median", "max"))
    return f"{middle} ({low}-{high})"


def print_model_parallel(table: dict[str, Any], storages: list[str], rounds: int, memory_rounds: int) -> None:
    memory = table["memory"]
    full, own = _mb(memory["full_state_bytes"]), _mb(memory["own_shard_bytes"])
    print(f"model_parallel (FSDP2), 2 processes (gloo, CPU), {full} MB state (rank 0's shard {own} MB), "
          f"{rounds} rounds + 1 warm-up, order alternated; memory: a launch of {memory_rounds} rounds + 1, "
          "MALLOC_MMAP_THRESHOLD_=1 MiB")  # fmt: skip
    header = ("storage", "variant", "ms blocked/save (min-max)", "s to durable (min-max)", "rank-0 peak +MB (warm-up)",
              "ms blocked, memory launch")  # fmt: skip
    widths = (7, 7, 30, 24, 26, 26)
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, widths, strict=True)))
    for storage in storages:
        for variant in ("sync", "async"):
            row = table[storage][variant]
            rss = f"{_mb(row['peak_rss_increase_bytes'])} ({_mb(row['peak_rss_increase_bytes_warmup'])})"
            cells = (storage, variant, _span(row["blocked_s"], 1e3, 1), _span(row["durable_s"]), rss,
                     _span(row["blocked_s_memory_launch"], 1e3, 1))  # fmt: skip
            print(" ".join(f"{cell:>{width}}" for cell, width in zip(cells, widths, strict=True)))
    for storage in storages:
        ratio = table[storage]["async_over_sync_blocked"]
        verdict = "holds" if table[storage]["holds"] else "MISSED"
        per_round = ", ".join(f"{r:.3f}" for r in ratio["per_round"])
        fresh = table[storage]["async_over_sync_blocked_memory_launch"]
        print(f"{storage}: async/sync blocked per round [{per_round}]: median {ratio['median']:.3f}, max "
              f"{ratio['max']:.3f} (target <= {TARGET} on the max: {verdict}); memory launch: max "
              f"{fresh['max']:.3f}")  # fmt: skip
    print(f"rank 0's peak RSS increase in a measured save: {_mb(memory['peak_rss_increase_bytes'])} MB = "
          f"{memory['peak_over_own_shard']:.2f} x its own shard, {memory['peak_over_full_state']:.2f} x the full "
          f"state; in a warm-up save {_mb(memory['warmup_peak_rss_increase_bytes'])} MB = "
          f"{memory['warmup_peak_over_own_shard']:.2f} x its shard")  # fmt: skip


def print_zero1(table: dict[str, Any], rounds: int, memory_rounds: int) -> None:
    full, own = _mb(table["full_state_bytes"]), _mb(table["own_shard_bytes"])
    print(f"data_parallel zero_stage=1, 2 processes, {full} MB state (rank 0 holds {own} MB), local disk, "
          f"synchronous saves, {rounds} rounds + 1 warm-up; memory: {memory_rounds} rounds + 1")  # fmt: skip
    print(f"{'variant':>13} {'s per save (min-max)':>22} {'rank-0 peak +MB (min-max)':>26} {'(warm-up)':>10}")
    for variant in ("per_rank", "consolidated"):
        row = table[variant]
        rss = _span(row["peak_rss_increase_bytes"], 1 / MB, 1)
        print(f"{variant:>13} {_span(row['save_s']):>22} {rss:>26} {_mb(row['peak_rss_increase_bytes_warmup']):>10}")
    time, memory = table["per_rank_over_consolidated_save_s"], table["per_rank_over_consolidated_peak_rss_increase"]
    print(f"per_rank / consolidated, paired per round: save time {_span(time, digits=3)}, "
          f"rank-0 peak memory {_span(memory, digits=3)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 13 MB state, 1 round, one launch per part (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "sharded_checkpoint.json"), help="where to write the JSON")
    args = parser.parse_args()
    size, rounds, memory_rounds = (
        ({"width": 512, "layers": 4}, 1, 1) if args.quick else ({"width": 2048, "layers": 10}, 6, 2)
    )

    server, env = s3_server()
    import fsspec

    workdir = Path(tempfile.mkdtemp(prefix="sharded-checkpoint-"))
    env = {**env, "AWS_CONFIG_FILE": str(workdir / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws-credentials")}  # fmt: skip
    bucket = f"sharded-{uuid.uuid4().hex[:8]}"
    s3 = fsspec.filesystem("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], key="benchmark", secret="benchmark")
    s3.mkdir(bucket)
    launches = {"timing": ({}, rounds), "memory": (MEMORY_ENV, memory_rounds)}
    if args.quick:  # a smoke run: one launch per part, its memory figures taken from the timing launch
        del launches["memory"]
    storages = {"model_parallel": ["local", "s3"], "zero1": ["local"]}
    results: dict[str, dict] = {}
    try:
        for part, labels in storages.items():
            for launch, (allocator, count) in launches.items():
                dirs = {"local": str(workdir / part / launch), "s3": f"s3://{bucket}/{part}/{launch}"}
                chosen = {label: dirs[label] for label in labels}
                results[f"{part}/{launch}"] = run_job(
                    part, chosen, {**size, "rounds": count}, {**env, **allocator}, workdir
                )
                shutil.rmtree(dirs["local"], ignore_errors=True)
    finally:
        server.stop()  # type: ignore[attr-defined]
        shutil.rmtree(workdir, ignore_errors=True)
    for part in storages if args.quick else []:
        results[f"{part}/memory"] = results[f"{part}/timing"]

    table = {
        "model_parallel": model_parallel_table(
            results["model_parallel/timing"], results["model_parallel/memory"], storages["model_parallel"]
        ),
        "zero1": zero1_table(results["zero1/timing"], results["zero1/memory"]),
    }
    print_model_parallel(table["model_parallel"], storages["model_parallel"], rounds, memory_rounds)
    print_zero1(table["zero1"], rounds, memory_rounds)
    config = {**size, "rounds": rounds, "memory_rounds": memory_rounds, "warmup_rounds": 1, "processes": 2,
              "memory_env": MEMORY_ENV, "target": TARGET, "quick": args.quick}  # fmt: skip
    out = {"machine": machine_info(), "config": config, "table": table, "runs": results}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    sharded, zero = result["table"]["model_parallel"], result["table"]["zero1"]
    full, own = sharded["memory"]["full_state_bytes"] / 1e6, sharded["memory"]["own_shard_bytes"] / 1e6
    blocked, memory = [], []
    for storage, where in (("local", "local disk"), ("s3", "S3")):
        ratio = sharded[storage]["async_over_sync_blocked"]  # paired per round; the target holds for every round
        blocked.append(summary_row("sharded_checkpoint", f"blocked time per save, async / sync, model_parallel shards, "
                           f"{full:.0f} MB, {where} (2 processes)", ratio["median"], span_of(ratio), "x",
                           f"≤ 0.1 (max {ratio['max']:.3f})", sharded[storage]["holds"]))  # fmt: skip
        peak = max(sharded[storage][variant]["peak_rss_increase_bytes"] for variant in ("sync", "async")) / 1e6
        label = f"rank-0 peak memory increase in a sharded save / its own shard ({own:.0f} of {full:.0f} MB), {where}"
        memory.append(summary_row("sharded_checkpoint", label, peak / own, None, "x"))
    zero_rows = [
        summary_row("sharded_checkpoint", f"{measure}, ZeRO-1 per-rank shares / consolidated file",
            zero[f"per_rank_over_consolidated_{key}"]["median"],
            span_of(zero[f"per_rank_over_consolidated_{key}"]), "x")
        for key, measure in (("save_s", "save time"), ("peak_rss_increase", "rank-0 peak memory increase in a save"))
    ]  # fmt: skip
    return blocked + memory + zero_rows


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    sharded, zero = result["table"]["model_parallel"], result["table"]["zero1"]
    rows = []
    for storage, where in (("local", "local disk"), ("s3", "S3 (moto on 127.0.0.1)")):
        sync, mine = sharded[storage]["sync"], sharded[storage]["async"]
        peak = max(sync["peak_rss_increase_bytes"], mine["peak_rss_increase_bytes"])
        durable = f"{sync['durable_s']['median']:.2f} / {mine['durable_s']['median']:.2f}"
        rows.append([where, md_ms(sync["blocked_s"]), md_ms(mine["blocked_s"]), durable, md_mb(peak)])
    header = ["storage", "sync: ms blocked per save", "async: ms blocked per save", "s until durable (sync / async)",
              "rank 0's peak increase, MB"]  # fmt: skip
    per_rank, consolidated = zero["per_rank"], zero["consolidated"]
    return (
        md_table(header, rows)
        + f"\n\nZeRO-1, s per save: per-rank shares {md_s(per_rank['save_s'])}, one consolidated "
        f"file {md_s(consolidated['save_s'])}; rank 0's peak increase, MB: "
        f"{md_mb(per_rank['peak_rss_increase_bytes']['median'])} against "
        f"{md_mb(consolidated['peak_rss_increase_bytes']['median'])}."
    )


if __name__ == "__main__":
    main()
