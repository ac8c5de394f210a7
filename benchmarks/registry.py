"""Every benchmark, in the order ``make bench`` runs them and the Performance page shows them."""

from __future__ import annotations

import importlib
from types import ModuleType

NAMES = (
    "data_parallel_step",
    "callback_overhead",
    "checkpoint_async",
    "preemption_cost",
    "pipeline_throughput",
    "resume_time",
    "process_start",
    "checkpoint_cost",
    "cost_levers",
    "data_loading",
    "sharded_checkpoint",
    "hang_watchdog",
    "goodput",
)


def benchmark(name: str) -> ModuleType:
    """The module of the benchmark ``name``: its ``main()``, ``rows(result)`` and ``details(result)``."""
    return importlib.import_module(f"benchmarks.{name}")
