"""The ``lightning-scale`` command: LightningCLI with checkpoints, preemption handling and cost tracking on.

    lightning-scale fit --config examples/configs/data_parallel.yaml
    lightning-scale fit --model my_pkg.MyModule --data my_pkg.MyData --trainer.strategy pipeline_parallel \\
        --checkpoint.dirpath s3://bucket/run --cost.provider gcp --cost.instance_type a2-highgpu-1g --cost.spot true
    lightning-scale consolidate CHECKPOINT OUT

Importing :mod:`lightning_scale` registers its strategies, so ``--trainer.strategy data_parallel``,
``model_parallel`` and ``pipeline_parallel`` (and their class paths with ``--trainer.strategy.<arg>``) work; any
callback can be added by class path (``--trainer.callbacks+=lightning_scale.callbacks.DivergenceRollback``).
Five callbacks are on by default, each configured under its own key or switched off with ``null``:

- ``--checkpoint`` :class:`~lightning_scale.callbacks.ResumableCheckpoint` (``dirpath`` default
  ``checkpoints``): atomic checkpoints, and auto-resume from the newest valid one;
- ``--preemption`` :class:`~lightning_scale.callbacks.SpotPreemption` (SIGTERM/SIGUSR1 by default): stop every
  rank at the same step, checkpoint, exit 143 for the orchestrator to restart the job;
- ``--cost`` :class:`~lightning_scale.callbacks.CostTracker`: needs the price of a node
  (``--cost.price_per_hour``, or ``--cost.provider`` and ``--cost.instance_type``);
- ``--hang`` :class:`~lightning_scale.callbacks.HangWatchdog`: a rank that makes no progress exits 75 with its
  stacks, for the orchestrator to restart the job;
- ``--stragglers`` :class:`~lightning_scale.callbacks.StragglerDetector`: a rank persistently slower than the others
  is named (rank, host) in every logger and at the end of fit, with what waiting for it cost.

A callback of one of these classes given in ``--trainer.callbacks`` replaces the default one.

The progress bar is Rich's, with the cost so far. Class paths in the current directory (``examples.…``,
your own package) are found as with ``python -m``.

One module per job: :mod:`~lightning_scale.cli.command` (the LightningCLI subclass), :mod:`~.strategy_flags` (the
strategy names rewritten for jsonargparse), :mod:`~.consolidate` (the second subcommand), :mod:`~.usage_errors`
(what a usage error is and how it is reported), :mod:`~.attempts` (a usage error handed to torchrun's next attempts)
and :mod:`~.main` (the entry point).
"""

from lightning_scale.cli.command import DEFAULT_CALLBACKS, ScaleCLI
from lightning_scale.cli.entry import main
from lightning_scale.cli.strategy_flags import strategy_names_as_class_paths

__all__ = ["DEFAULT_CALLBACKS", "ScaleCLI", "main", "strategy_names_as_class_paths"]
