"""The run report: one self-contained HTML file of where a run's money and time went, from the files it left behind.

``lightning-scale report RUN_DIR [--out report.html]``, or :func:`write_report` from Python.
"""

from __future__ import annotations

from pathlib import Path

from lightning_scale.report.records import Attempt, CostSplit, RunRecord, collect
from lightning_scale.report.render import render_html

__all__ = ["Attempt", "CostSplit", "RunRecord", "collect", "render_html", "write_report"]


def write_report(source: str | Path, out: str | Path) -> RunRecord:
    """Write the report of the run under ``source`` (its ``default_root_dir`` or checkpoint directory) to ``out``.

    Args:
        source: The run's directory, or its checkpoint directory.
        out: The HTML file to write (its directory is created).

    Returns:
        What the report shows.

    Raises:
        ConfigurationError: ``source`` holds no run.
    """
    record = collect(source)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(record))
    return record
