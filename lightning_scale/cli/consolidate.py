"""``lightning-scale consolidate CHECKPOINT_DIR OUT``: a sharded checkpoint directory written as one file."""

from __future__ import annotations

import argparse

from lightning_scale.checkpoint import consolidate_checkpoint

__all__ = ["CONSOLIDATE_DESCRIPTION", "CONSOLIDATE_HELP", "consolidate"]

CONSOLIDATE_DESCRIPTION = "Write a sharded checkpoint directory as one file that torch.load and Lightning read."
# LightningCLI owns the list of subcommands: the one it does not know is named below it
CONSOLIDATE_HELP = f"Also: lightning-scale consolidate CHECKPOINT_DIR OUT. {CONSOLIDATE_DESCRIPTION}"


def consolidate(argv: list[str]) -> None:
    """Run the subcommand on its arguments ``argv``; a checkpoint it cannot read is a usage error (exit 2)."""
    parser = argparse.ArgumentParser(prog="lightning-scale consolidate", description=CONSOLIDATE_DESCRIPTION)
    parser.add_argument("checkpoint", help="sharded checkpoint directory (local path)")
    parser.add_argument("out", help="the single file to write")
    args = parser.parse_args(argv)
    try:
        consolidate_checkpoint(args.checkpoint, args.out)
    except (OSError, ValueError, RuntimeError) as err:  # missing, unreadable, corrupt, or OUT taken: no traceback
        parser.error(f"cannot consolidate {args.checkpoint}: {err}")
    print(f"Consolidated {args.checkpoint} into {args.out}")
