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
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

import lightning_scale  # registers the strategies
from lightning_scale import distributed, knobs
from lightning_scale.callbacks import (
    CostTracker,
    HangWatchdog,
    ResumableCheckpoint,
    SpotPreemption,
    StragglerDetector,
)
from lightning_scale.checkpoint import consolidate_checkpoint
from lightning_scale.errors import USAGE_ERROR_EXIT_CODE, UsageError
from lightning_scale.restart import supervise, warm_restarts_apply
from lightning_scale.restart.supervisor import LAUNCHER_PID_VARIABLE

if TYPE_CHECKING:
    from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy, PipelineParallelStrategy

    ScaleStrategy = DataParallelStrategy | ModelParallelStrategy | PipelineParallelStrategy

__all__ = ["ScaleCLI", "main", "strategy_names_as_class_paths"]

DEFAULT_CALLBACKS: dict[str, tuple[type[Callback], dict[str, Any]]] = {
    "checkpoint": (ResumableCheckpoint, {"dirpath": "checkpoints"}),
    "preemption": (SpotPreemption, {}),
    "cost": (CostTracker, {}),
    "hang": (HangWatchdog, {}),
    "stragglers": (StragglerDetector, {}),
}


CONSOLIDATE_DESCRIPTION = "Write a sharded checkpoint directory as one file that torch.load and Lightning read."
# LightningCLI owns the list of subcommands: the one it does not know is named below it
CONSOLIDATE_HELP = f"Also: lightning-scale consolidate CHECKPOINT_DIR OUT. {CONSOLIDATE_DESCRIPTION}"


class ScaleCLI(LightningCLI):
    """LightningCLI with the :data:`DEFAULT_CALLBACKS` as configurable keys and a strategy name check.

    Args:
        args: Command-line arguments (default: ``sys.argv[1:]``); everything else as :class:`LightningCLI`.

    Example:
        >>> sorted(DEFAULT_CALLBACKS)  # lightning-scale fit ... --checkpoint.dirpath s3://bucket/run --cost null
        ['checkpoint', 'cost', 'hang', 'preemption', 'stragglers']
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_kwargs", {"prog": "lightning-scale", "epilog": CONSOLIDATE_HELP})
        # a restarted job runs the same command again: its config.yaml is already there
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add ``--checkpoint``, ``--preemption``, ``--cost``, ``--hang`` and ``--stragglers``: on by default,
        ``null`` switches one off."""
        for key, (callback, init_args) in DEFAULT_CALLBACKS.items():
            parser.add_lightning_class_args(callback, key, subclass_mode=True, required=False)
            class_path = f"{callback.__module__}.{callback.__qualname__}"
            parser.set_defaults({key: {"class_path": class_path, "init_args": init_args}})

    def before_instantiate_classes(self) -> None:
        """Refuse an unknown strategy name and a missing price before anything is built; under torchrun, train on
        the nodes its rendezvous formed."""
        config = self.config.get(str(self.subcommand), self.config)
        _nodes_of_the_rendezvous(config)
        strategy = config.get("trainer", {}).get("strategy")
        if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
            names = ", ".join(sorted(StrategyRegistry.available_strategies()))
            self._error(f"--trainer.strategy {strategy!r} is not a registered strategy; choose one of: {names}.")
        cost = config.get("cost")
        priced = cost is None or cost.init_args.get("price_per_hour") is not None
        if not priced and (cost.init_args.get("provider") is None or cost.init_args.get("instance_type") is None):
            self._error(
                "--cost needs the price of one node: --cost.price_per_hour 3.2, or --cost.provider gcp "
                "--cost.instance_type a2-highgpu-1g (add --cost.spot true on spot capacity); --cost null switches "
                "cost tracking off."
            )

    def instantiate_classes(self) -> None:
        """Build the classes; a bad argument refused by a lightning-scale class is a usage error, not a traceback."""
        try:
            super().instantiate_classes()
        except ValueError as error:
            ours = _raised_by_lightning_scale(error)
            if ours is None:
                raise
            self._error(str(ours))

    def _error(self, message: str) -> None:
        self._parser(self.subcommand).error(message)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        # a default switched off is None; one the user also added in --trainer.callbacks gives way to theirs
        callbacks = [c for c in callbacks if c is not None and not any(isinstance(g, type(c)) for g in given)]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
            callbacks.append(RichProgressBar())  # with the cost so far (CostTracker's progress_bar)
        return super()._instantiate_trainer(config, callbacks)


def _nodes_of_the_rendezvous(config: Any) -> None:
    """``trainer.num_nodes`` set to the number of nodes torchrun's rendezvous formed (``GROUP_WORLD_SIZE``): an
    elastic job (``--nnodes MIN:MAX``) gets another one whenever nodes leave or join, and Lightning refuses a count
    that differs from the processes it finds."""
    formed = os.environ.get("GROUP_WORLD_SIZE")
    given = config.get("trainer", {}).get("num_nodes", 1)
    if formed is None or int(formed) == given:
        return
    rank_zero_info(f"--trainer.num_nodes {given} -> {formed}: the nodes torchrun's rendezvous formed.")
    config["trainer.num_nodes"] = int(formed)


def _raised_by_lightning_scale(error: BaseException) -> BaseException | None:
    """``error`` or the exception it was raised from whose innermost frame is lightning-scale code, if any."""
    package = os.path.dirname(os.path.abspath(lightning_scale.__file__))
    while error is not None:
        traceback = error.__traceback__
        while traceback is not None and traceback.tb_next is not None:
            traceback = traceback.tb_next
        if traceback is not None and traceback.tb_frame.f_code.co_filename.startswith(package + os.sep):
            return error
        error = error.__cause__  # type: ignore[assignment]
    return None


_STRATEGY_FLAG = "--trainer.strategy"


def strategy_names_as_class_paths(argv: list[str]) -> list[str]:
    """``argv`` with lightning-scale's strategy names (``--trainer.strategy data_parallel``, or the name in a
    ``--config`` file) given as their class paths where ``--trainer.strategy.<arg>`` flags follow: jsonargparse takes
    those after a class path only. The registered names take no arguments, so both forms build one strategy.

    Example:
        >>> strategy_names_as_class_paths(["--trainer.strategy", "data_parallel", "--trainer.strategy.zero_stage=1"])
        ['--trainer.strategy', 'lightning_scale.strategies.DataParallelStrategy', '--trainer.strategy.zero_stage=1']
    """
    names = {cls.strategy_name: f"lightning_scale.strategies.{cls.__name__}" for cls in _lightning_scale_strategies()}
    out: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        key, inline, value = arg.partition("=")
        nested_later = any(later.startswith(f"{_STRATEGY_FLAG}.") for later in argv[index + 1 :])
        if key == _STRATEGY_FLAG and (inline or index + 1 < len(argv)):
            value = value if inline else argv[index + 1]
            value = names.get(value, value) if nested_later else value  # a bare name stays a registry name
            out += [f"{key}={value}"] if inline else [key, value]
            index += 1 if inline else 2
            continue
        if key == "--config" and (inline or index + 1 < len(argv)):
            path = value if inline else argv[index + 1]
            out += [arg] if inline else [arg, path]
            index += 1 if inline else 2
            named = names.get(_strategy_in_config(path) or "")
            if named is not None and nested_later:
                out.append(f"{_STRATEGY_FLAG}={named}")  # the same strategy, now open to --trainer.strategy.<arg>
            continue
        out.append(arg)
        index += 1
    return out


def _lightning_scale_strategies() -> list[type[ScaleStrategy]]:
    from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy, PipelineParallelStrategy

    return [DataParallelStrategy, ModelParallelStrategy, PipelineParallelStrategy]


def _strategy_in_config(path: str) -> str | None:
    """The ``trainer.strategy`` of a config file when it is a name (``None`` otherwise or when it cannot be read:
    jsonargparse reports an unreadable config itself)."""
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        return None
    strategy = (config or {}).get("trainer", {}).get("strategy") if isinstance(config, dict) else None
    return strategy if isinstance(strategy, str) else None


def _consolidate(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="lightning-scale consolidate", description=CONSOLIDATE_DESCRIPTION)
    parser.add_argument("checkpoint", help="sharded checkpoint directory (local path)")
    parser.add_argument("out", help="the single file to write")
    args = parser.parse_args(argv)
    try:
        consolidate_checkpoint(args.checkpoint, args.out)
    except (OSError, ValueError) as err:  # missing, unreadable or corrupt: say so, without a traceback
        parser.error(f"cannot consolidate {args.checkpoint}: {err}")
    print(f"Consolidated {args.checkpoint} into {args.out}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``lightning-scale`` and ``python -m lightning_scale``; once the command finished, it tears down
    the process group, whose gloo threads could otherwise abort the exiting process. Called with ``argv`` (from
    Python), it leaves the garbage collector as it was; as the command, it speeds up the process's exit (see
    :func:`lightning_scale.distributed.destroy_process_group`). As the command under torchrun, each rank's process
    runs the training as warm-restarted children (:mod:`lightning_scale.restart`; ``LIGHTNING_SCALE_WARM_RESTARTS``)
    and ends with their final exit code at once, without the interpreter's teardown."""
    explicit = argv is not None
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["consolidate"]:
        _consolidate(argv[1:])
        return
    if os.getcwd() not in sys.path:  # class paths in the current directory, as `python -m` finds them
        sys.path.insert(0, os.getcwd())
    if not explicit and warm_restarts_apply(knobs.WARM_RESTARTS):
        code = supervise(lambda: _run(argv, explicit), knobs.WARM_RESTARTS)
        # The parent trained nothing and has nothing to finish (its children ran their exit functions); the teardown of
        # an interpreter with torch and Lightning imported takes about a second here, which torchrun would wait for
        # before it restarts the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _run(argv, explicit)


def _run(argv: list[str], explicit: bool) -> None:
    """The command itself: one training attempt."""
    rewritten = strategy_names_as_class_paths(argv)
    earlier = _usage_error_of_an_earlier_attempt()
    if earlier is not None:  # torchrun restarts failed workers whatever their exit code: end this attempt at once
        _end_a_later_attempt(earlier)
    try:
        ScaleCLI(args=rewritten if explicit or rewritten != argv else None)  # not kept: garbage once finished
    except Exception as error:
        usage = _usage_error_in(error)
        if usage is None:
            raise
        _remember_for_later_attempts(str(usage))
        _exit_on_usage_error(str(usage))
    finally:  # a gloo group alive at interpreter exit can abort the process (exit -6); the command's process ends
        distributed.destroy_process_group(process_ends=not explicit)


def _usage_error_in(error: BaseException | None) -> BaseException | None:
    """``error`` or the exception it was raised from or during, if it is a :class:`UsageError`."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, UsageError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _exit_on_usage_error(message: str) -> NoReturn:
    """One short report on rank 0 (every rank found the same), then :data:`USAGE_ERROR_EXIT_CODE` on every rank."""
    if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # Lightning sets it on the function at import
        print(f"lightning-scale: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(USAGE_ERROR_EXIT_CODE)


def _end_a_later_attempt(earlier: str) -> NoReturn:
    """Exit on the usage error an earlier attempt of this torchrun job found. torchrun stops an attempt's other
    workers as soon as one exits, so rank 0's node-mates wait (5 s at most) until rank 0 has printed the report."""
    reported = Path(f"{_attempt_marker()}.reported-{os.environ.get('TORCHELASTIC_RESTART_COUNT')}")
    if rank_zero_only.rank == 0:  # type: ignore[attr-defined]
        print(f"lightning-scale: error: {earlier} (the same usage error stopped this torchrun job's first attempt)",
              file=sys.stderr, flush=True)  # fmt: skip
        with contextlib.suppress(OSError):  # only lets the other workers go
            reported.touch()
    elif os.environ.get("GROUP_RANK") == "0":
        deadline = time.monotonic() + 5.0
        while not reported.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    raise SystemExit(USAGE_ERROR_EXIT_CODE)


def _attempt_marker() -> Path | None:
    """Where a torchrun job's attempts leave a usage error for the next one on this node: named by the run id and
    the torchrun agent's process (the workers' parent, or their warm-restart parent's), so a new torchrun command
    never reads an old one."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or os.environ.get("TORCHELASTIC_RESTART_COUNT") is None:
        return None
    agent = os.environ.get(LAUNCHER_PID_VARIABLE, str(os.getppid()))
    return Path(tempfile.gettempdir()) / f"lightning-scale-usage-error-{run_id}-{agent}.txt"


def _usage_error_of_an_earlier_attempt() -> str | None:
    marker = _attempt_marker()
    if marker is None or os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" or not marker.exists():
        return None
    return marker.read_text()


def _remember_for_later_attempts(message: str) -> None:
    marker = _attempt_marker()
    if marker is not None:
        with contextlib.suppress(OSError):  # only a shortcut for the next attempts
            marker.write_text(message)
