"""`make bench`: every benchmark in one run, one summary table with each target and whether it holds, one JSON.

One method for every ratio with a target (``_common.py``): the variants alternate in the same processes (or in paired
launches where a process can only measure one, as a resident peak), their order rotated every round (with two: swapped);
each round gives one paired ratio, and a target is met when the bound of those ratios' spread meets it: the upper
quartile for a ``<=`` target, the lower quartile for a ``>=`` one (three rounds in four), never the median. A few rows
are judged stricter still, by every round (``sharded_checkpoint``). Comparisons of identical code are labelled noise
floors, without a target, and a target stated for a benchmark holds for every configuration it runs.

Each benchmark of :mod:`benchmarks.registry` writes its own JSON (``benchmarks/results/<name>.json``); this module runs
them one after another, never two at once (one that fails is named at the end, which exits 1, and costs only its own
rows), and writes ``benchmarks/results/latest.json``: the runs its rows come from
(command, date, the commit measured and the machine of each: an ``--only`` refresh is a run of its own, see
:func:`merge_runs`), the summary rows (each benchmark's ``rows``), and every benchmark's full result. The site's
Performance page is generated from it (:func:`performance_page`, called by ``docs/_hooks/generated.py`` when ``make
docs`` builds the site).

    .venv/bin/python -m benchmarks.run            # the full suite (about 70 min on 2 cores)
    .venv/bin/python -m benchmarks.run --quick    # a smoke run (under 4 min): small sizes, few repeats
    .venv/bin/python -m benchmarks.run --only callback_overhead    # re-measure one; its rows replace the last run's

CPU only: no benchmark here has a CUDA/nccl variant yet (memory at peak reads the allocator's peak on a GPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info
from benchmarks._summary import Row
from benchmarks.registry import NAMES, benchmark

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def markdown(summary: list[Row]) -> str:
    """The summary as a Markdown table."""
    lines = ["| benchmark | measure | median (min-max) | target | holds |", "|---|---|---|---|---|"]
    for r in summary:
        verdict = "" if r["holds"] is None else ("yes" if r["holds"] else "**no**")
        lines.append(f"| `{r['benchmark']}` | {r['measure']} | {r['figure']} | {r['target'] or ''} | {verdict} |")
    return "\n".join(lines)


def performance_page(latest: dict[str, Any]) -> str:
    """What the site's Performance page shows of ``latest``: the table, each run its rows come from (command, date,
    commit, machine), then every benchmark's figures (its ``details``)."""
    lines = [markdown(latest["summary"]), "", "The rows come from these runs:", ""]
    for run in latest["runs"]:
        m = run["machine"]
        commit = f"at {run['commit']}" if run.get("commit") else f"recorded in {run['recorded_in']}"
        lines.append(
            f"- `{run['command']}` on {run['date']} {commit}: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
            f"torch {m['torch']}, Lightning {m['lightning']} ({', '.join(run['benchmarks'])})"
        )
    lines += ["", f"{sum(latest['seconds'].values()) / 60:.0f} min of benchmarks in all. Each benchmark's figures:"]
    figures = [f"**`{name}`**\n\n{benchmark(name).details(latest['results'][name])}" for name in NAMES
               if name in latest["results"]]  # fmt: skip
    return "\n".join(lines) + "\n\n" + "\n\n".join(figures)


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


def selected(only: list[str] | None) -> list[str]:
    """The benchmarks a run measures: ``--only``'s, else every one of the registry, in its order.

    Examples:
        >>> selected(None) == list(NAMES) and selected(["goodput"]) == ["goodput"]
        True
    """
    return list(only or NAMES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark's smoke mode (under 4 min)")
    parser.add_argument("--out", default=str(RESULTS / "latest.json"), help="where to write the summary JSON")
    parser.add_argument(
        "--only", nargs="*", choices=sorted(NAMES), help="run these only; their rows replace those in --out"
    )
    args = parser.parse_args()
    names = selected(args.only)

    command_line = " ".join(["python -m benchmarks.run", *(arg for arg in sys.argv[1:] if not arg.startswith("--out"))])
    commit = _commit()  # before the run: it rewrites the tracked results it measures
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    previous = json.loads(Path(args.out).read_text()) if args.only and Path(args.out).exists() else None
    if previous is not None and previous["quick"] == args.quick:  # --only refreshes those rows of the last run
        results, seconds, runs = previous["results"], previous["seconds"], previous["runs"]
    failed: dict[str, int] = {}  # a benchmark that fails costs its own rows, not the others'
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:  # one at a time: concurrent benchmarks would measure each other
            out = Path(scratch if args.quick else RESULTS) / f"{name}.json"
            command = [sys.executable, "-m", f"benchmarks.{name}", f"--out={out}", *(["--quick"] if args.quick else [])]
            print(f"\n=== {name}: {' '.join(command[1:])}", flush=True)
            started = time.monotonic()
            code = subprocess.run(command, cwd=HERE.parent).returncode
            if code != 0:
                failed[name] = code
                continue
            seconds[name] = time.monotonic() - started
            results[name] = json.loads(out.read_text())
    summary = [r for name in NAMES if name in results for r in benchmark(name).rows(results[name])]

    print(f"\nlightning-scale benchmarks{' (quick: smoke sizes, not for comparison)' if args.quick else ''}")
    width = max((len(r["measure"]) for r in summary), default=0)
    for r in summary:
        verdict = "" if r["holds"] is None else ("holds" if r["holds"] else "MISSED")
        print(f"{r['benchmark']:<20} {r['measure']:<{width}} {r['figure']:>24} {r['target'] or '':>7} {verdict}")
    machine = machine_info()
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
          f"lightning {machine['lightning']}; {sum(seconds.values()) / 60:.1f} min")  # fmt: skip
    run = {"command": command_line, "date": time.strftime("%Y-%m-%d"), "commit": commit, "machine": machine,
           "benchmarks": [name for name in names if name not in failed]}  # fmt: skip
    latest = {
        "runs": merge_runs(runs, run) if run["benchmarks"] else runs,
        "quick": args.quick,
        "seconds": seconds,
        "summary": summary,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(latest, indent=1))
    print(f"wrote {args.out} (the site's Performance page: make docs)")
    if failed:
        codes = ", ".join(f"{name} (exit {code})" for name, code in failed.items())
        sys.exit(f"benchmarks that failed, without rows in {args.out}: {codes}; their output is above")


if __name__ == "__main__":
    main()
