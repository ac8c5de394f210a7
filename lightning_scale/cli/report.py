"""``lightning-scale report RUN_DIR [--out report.html]``: where a run's money and time went, as one HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_scale.errors import UsageError
from lightning_scale.report import write_report
from lightning_scale.report.wandb_report import publish, report_spec, require_credentials

__all__ = ["REPORT_DESCRIPTION", "REPORT_HELP", "report"]

REPORT_DESCRIPTION = (
    "Write one self-contained HTML report of a run (loss against dollars and hours, its attempts on a timeline, "
    "where the money went, right-sizing advice) from the files it left behind; works while it is still going."
)


REPORT_HELP = "Also: lightning-scale report RUN_DIR [--out report.html]: where a run's money and time went, as HTML."


def report(argv: list[str]) -> None:
    """Run the subcommand on its arguments ``argv``; a directory that holds no run is a usage error (exit 2)."""
    parser = argparse.ArgumentParser(prog="lightning-scale report", description=REPORT_DESCRIPTION)
    parser.add_argument("run", help="the run's directory (its default_root_dir) or its checkpoint directory")
    parser.add_argument("--out", default="report.html", help="the HTML file to write (default: report.html)")
    parser.add_argument(
        "--wandb",
        metavar="ENTITY/PROJECT",
        help="also publish the same views as a W&B Report of that project (needs WANDB_API_KEY and wandb-workspaces)",
    )
    args = parser.parse_args(argv)
    if args.wandb is not None and args.wandb.count("/") != 1:
        parser.error(f"--wandb {args.wandb}: give the W&B entity and project as ENTITY/PROJECT")
    out = Path(args.out)
    if out.is_dir() or (out.exists() and out.suffix != ".html"):  # an earlier report is replaced, nothing else
        parser.error(f"--out {args.out} exists and is not an HTML report; pass the path of the HTML file to write")
    try:
        if args.wandb is not None:
            require_credentials()  # before the work, and before the W&B Report API is needed
        record = write_report(args.run, args.out)
        attempts = len(record.attempts)
        print(f"Wrote {args.out}: {attempts} attempt{'s' if attempts != 1 else ''}, status: {record.status}.")
        if args.wandb is not None:
            entity, project = args.wandb.split("/")
            spec = report_spec(entity, project, record.logged_keys, record.loss_key, record.monitor_key)
            print(f"Published the W&B Report: {publish(spec)}")
    except UsageError as err:
        parser.error(str(err))
