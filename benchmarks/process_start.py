"""Process start and exit: the CPU and wall time of a process that imports lightning-scale (with torch and
Lightning) and exits, as every launched rank, forkserver and cold restart does, with the package's frozen imports
(``lightning_scale._collector``) against the garbage collector left to walk those objects, as without it.

Each launch runs ``python -c`` importing the test harness's runner module (what every rank of the suite's jobs
imports) and returns to the interpreter's exit. ``stock`` makes ``gc.disable`` and ``gc.freeze`` do nothing
before that import, so that the same modules are imported with the collector running during the import
and at exit. Paired launches, the order swapped every round; a process's CPU is its user and system time
(``RUSAGE_CHILDREN``). Writes ``benchmarks/results/process_start.json``.

    .venv/bin/python -m benchmarks.process_start [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import machine_info, meets, paired_ratios, rotated, spread
from benchmarks._summary import Row, bound_text, md_s, md_table, span_of, summary_row

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMPORT = "import lightning_scale.testing.runner"
PROGRAMS = {
    "ours": IMPORT,
    "stock": f"import gc; gc.disable = gc.freeze = lambda *args, **kwargs: None; {IMPORT}",
}
CPU_TARGET = 0.85


def launch(program: str) -> dict[str, float]:
    """One process running ``program``: its CPU and wall seconds."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "process_start.json"))
    args = parser.parse_args()
    rounds = 1 if args.quick else 16
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in PROGRAMS}
    for index in range(rounds):
        for name in rotated(list(PROGRAMS), index):
            runs[name].append(launch(PROGRAMS[name]))
    table = {name: {key: spread([r[key] for r in rs]) for key in ("cpu_s", "wall_s")} for name, rs in runs.items()}
    ratios = {key: paired_ratios([o[key] / s[key] for o, s in zip(runs["ours"], runs["stock"], strict=True)])
              for key in ("cpu_s", "wall_s")}  # fmt: skip
    result = {"machine": machine_info(), "config": {"rounds": rounds, "quick": args.quick, "programs": PROGRAMS},
              "table": table, "ours_over_stock": ratios,
              "holds": meets(ratios["cpu_s"], CPU_TARGET)}  # fmt: skip
    print(f"process start and exit, {rounds} paired rounds: median (min-max) seconds")
    for name, entry in table.items():
        print(f"  {name:<6} CPU {md_s(entry['cpu_s'])}, wall {md_s(entry['wall_s'])}")
    cpu_ratio, wall_ratio = ratios["cpu_s"], ratios["wall_s"]
    print(f"  ours / stock, CPU: median {cpu_ratio['median']:.3f}, upper quartile {cpu_ratio['upper_quartile']:.3f} "
          f"(target ≤ {CPU_TARGET}); wall {wall_ratio['median']:.3f}")  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def rows(result: dict) -> list[Row]:
    """CPU and wall time of a process importing the package and exiting, ours over stock, paired."""
    cpu, wall = result["ours_over_stock"]["cpu_s"], result["ours_over_stock"]["wall_s"]
    stock = result["table"]["stock"]["cpu_s"]["median"]
    measure = f"CPU of a process importing lightning-scale and exiting, frozen imports / stock ({stock:.2f} s)"
    target, same = bound_text(cpu, CPU_TARGET), "wall time of the same, frozen imports / stock"
    return [
        summary_row("process_start", measure, cpu["median"], span_of(cpu), "x", target, result["holds"]),
        summary_row("process_start", same, wall["median"], span_of(wall), "x"),
    ]


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    table = [[name, md_s(entry["cpu_s"]), md_s(entry["wall_s"])] for name, entry in result["table"].items()]
    return f"{result['config']['rounds']} paired rounds:\n\n" + md_table(["variant", "CPU s", "wall s"], table)


if __name__ == "__main__":
    main()
