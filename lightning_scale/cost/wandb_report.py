"""Cost in a W&B run: pricing assumptions in the config, totals in the summary, a cost-vs-metric table and plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["log_cost_table", "write_pricing_config", "write_summary"]

TABLE_KEY = "cost/table"


def write_pricing_config(run: Any, fields: Mapping[str, object]) -> None:
    """Put the pricing assumptions into the run config (a resumed run may have changed them)."""
    run.config.update(dict(fields), allow_val_change=True)


def write_summary(run: Any, values: Mapping[str, object]) -> None:
    for key, value in values.items():
        run.summary[key] = value


def log_cost_table(run: Any, evaluations: Sequence[Mapping[str, Any]], plotted: Sequence[str]) -> list[str]:
    """Log every evaluation's price and metrics as ``cost/table``, with a line plot of each ``plotted`` metric.

    Each evaluation is ``{"step": int, "usd_total": float, "hours": float, "metrics": {name: value}}``. Returns the
    logged keys.
    """
    import wandb  # here, not at module level: importing wandb costs every process ~0.7 s at start

    names = sorted({name for evaluation in evaluations for name in evaluation["metrics"]})
    columns = ["step", "usd_total", "hours", *names]
    rows = [[e["step"], e["usd_total"], e["hours"], *(e["metrics"].get(name) for name in names)] for e in evaluations]
    table = wandb.Table(columns=columns, data=rows)
    logged: dict[str, Any] = {TABLE_KEY: table}
    for metric in plotted:
        if metric in names:
            title = f"{metric} vs cost (USD)"
            logged[f"cost/{metric}_vs_usd"] = wandb.plot.line(table, "usd_total", metric, title=title)
    run.log(logged)
    return list(logged)
