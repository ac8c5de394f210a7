"""The run report's views as a W&B Report (``wandb-workspaces``): built from the keys a run logged, saved online only.

:func:`report_spec` builds the report without touching the network: its blocks and panels can be checked against the
keys of a real (offline) run; :func:`publish` saves it to W&B, which needs ``WANDB_API_KEY``.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from lightning_scale.errors import ConfigurationError

__all__ = ["panel_keys", "publish", "report_spec", "require_credentials"]

STEP = "trainer/global_step"


def _reports() -> Any:
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError as err:
        raise ConfigurationError(
            "lightning-scale report --wandb needs the W&B Report API: pip install 'lightning-scale[wandb-report]' "
            f"(wandb-workspaces) ({err})."
        ) from err
    return wr


def report_spec(entity: str, project: str, keys: Collection[str], loss_key: str | None, monitor_key: str | None) -> Any:
    """A ``wandb_workspaces`` Report of the runs of ``entity/project``: loss and the monitored metric against dollars
    and hours, the cost so far and its projection, what preemptions, stragglers and idle time cost, the cost table,
    and the preemption and restart panels. A panel is added only for keys in ``keys`` (what the runs logged)."""
    wr = _reports()
    present = set(keys)

    def lines(x: str, ys: list[str | None], title: str) -> list[Any]:
        shown = [y for y in ys if y is not None and y in present]
        return [wr.LinePlot(title=title, x=x, y=shown)] if shown and x in present else []

    runs = [wr.Runset(entity=entity, project=project, name="runs")]
    curves = [
        *lines("cost/usd_total", [loss_key], f"{loss_key} against dollars"),
        *lines("cost/usd_total", [monitor_key], f"{monitor_key} against dollars"),
        *lines("cost/hours", [loss_key, monitor_key], "against hours billed"),
    ]
    cost = [
        *lines(STEP, ["cost/usd_total", "cost/projected_usd"], "dollars so far, and projected at the last step"),
        *lines(STEP, ["cost/preemption_waste_usd", "stragglers/usd"], "dollars lost to preemptions and stragglers"),
        *lines(STEP, ["cost/idle_fraction"], "idle share of the wall time"),
    ]
    if "cost/usd_total" in present:
        cost.append(wr.ScalarChart(title="dollars", metric="cost/usd_total"))
    restarts = [
        *lines(STEP, ["preemption/step"], "preempted at step"),
        *lines(STEP, ["preemption/seconds_to_durable"], "notice to durable checkpoint (s)"),
        *lines(STEP, ["cost/nodes"], "nodes"),
    ]
    blocks: list[Any] = [
        wr.H1("Where the money went"),
        wr.P(
            "Written by lightning-scale from the keys its CostTracker, SpotPreemption and StragglerDetector log: the "
            "same views as `lightning-scale report` on a run's directory."
        ),
    ]
    for title, panels in (("Loss against cost", curves), ("Cost", cost), ("Preemptions and restarts", restarts)):
        if panels:
            blocks += [wr.H2(title), wr.PanelGrid(runsets=runs, panels=panels)]
    if "cost/table" in present:
        table = wr.WeavePanelSummaryTable(table_name="cost/table")
        blocks += [wr.H2("Cost at every validation"), wr.PanelGrid(runsets=runs, panels=[table])]
    report = wr.Report(
        entity=entity, project=project, title=f"Cost of {project}", description="lightning-scale's cost report"
    )
    report.blocks = blocks
    return report


def panel_keys(report: Any) -> set[str]:
    """Every key the report's panels plot."""
    found: set[str] = set()
    for block in report.blocks:
        for panel in getattr(block, "panels", []) or []:
            for name in ("x", "y", "metric", "metrics", "table_name"):
                value = getattr(panel, name, None)
                if isinstance(value, str):
                    found.add(value)
                elif isinstance(value, (list, tuple)):
                    found.update(v for v in value if isinstance(v, str))
    return found


def require_credentials() -> None:
    """Raise :class:`ConfigurationError` unless W&B has an API key: ``WANDB_API_KEY``, or ``wandb login``'s entry in
    ``~/.netrc``."""
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    logged_in = netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")
    if not (os.environ.get("WANDB_API_KEY") or logged_in):
        raise ConfigurationError(
            "lightning-scale report --wandb publishes to W&B and needs WANDB_API_KEY (your key from "
            "https://wandb.ai/authorize) or `wandb login`; without it, write the HTML report only (drop --wandb)."
        )


def publish(report: Any) -> str:
    """Save ``report`` to W&B and return its URL (after :func:`require_credentials`)."""
    require_credentials()
    report.save()
    return str(report.url)
