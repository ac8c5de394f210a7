"""The LightningCLI subclass of the ``lightning-scale`` command: the default callbacks as configurable keys, checks
made before anything is built, and the Trainer built with them."""

from __future__ import annotations

import importlib
import os
import pickle
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_scale._lightning_internals import drop_unset_wandb_anonymous
from lightning_scale.callbacks import (
    CostTracker,
    HangWatchdog,
    ResumableCheckpoint,
    SpotPreemption,
    StragglerDetector,
)
from lightning_scale.checkpoint.damaged import gist
from lightning_scale.cli.consolidate import CONSOLIDATE_HELP
from lightning_scale.cli.progress_bar import ScaleProgressBar
from lightning_scale.cli.report import REPORT_HELP
from lightning_scale.errors import ConfigurationError, UsageError

__all__ = ["DEFAULT_CALLBACKS", "ScaleCLI"]

DEFAULT_CALLBACKS: dict[str, tuple[type[Callback], dict[str, Any]]] = {
    "checkpoint": (ResumableCheckpoint, {"dirpath": "checkpoints"}),
    "preemption": (SpotPreemption, {}),
    "cost": (CostTracker, {}),
    "hang": (HangWatchdog, {}),
    "stragglers": (StragglerDetector, {}),
}
"""The callbacks the command adds, by their key: ``--KEY.ARG value`` configures one, ``--KEY null`` switches it off."""


class ScaleCLI(LightningCLI):
    """LightningCLI with the :data:`DEFAULT_CALLBACKS` as configurable keys and a strategy name check.

    Args:
        args: Command-line arguments (default: ``sys.argv[1:]``); everything else as :class:`LightningCLI`.

    Examples:
        >>> sorted(DEFAULT_CALLBACKS)  # lightning-scale fit ... --checkpoint.dirpath s3://bucket/run --cost null
        ['checkpoint', 'cost', 'hang', 'preemption', 'stragglers']
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_kwargs", {"prog": "lightning-scale", "epilog": f"{CONSOLIDATE_HELP} {REPORT_HELP}"})
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

    def _config(self) -> Any:
        return self.config.get(str(self.subcommand), self.config)

    def _parse_ckpt_path(self) -> None:
        """Lightning reads the hyperparameters of a ``--ckpt_path`` file before anything is built: a path that does
        not exist or a file that does not load is a usage error here, not a traceback."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        named = isinstance(path, str) and (path in ("last", "best", "hpc") or path.lower().startswith("registry"))
        local = isinstance(path, str) and not named and "://" not in path
        if local and not Path(str(path)).exists():
            raise ConfigurationError(
                f"--ckpt_path {path} does not exist; pass a checkpoint file or directory, or leave --ckpt_path out "
                "to resume from the newest valid checkpoint in --checkpoint.dirpath."
            )
        given = _model_arguments(self.config[subcommand]) if subcommand else {}
        try:
            super()._parse_ckpt_path()
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
            raise ConfigurationError(
                f"--ckpt_path {path} cannot be loaded ({gist(err)}): it is damaged, not a "
                "checkpoint, or holds objects torch.load refuses; pass another, or leave --ckpt_path out to resume "
                "from the newest valid one in --checkpoint.dirpath."
            ) from None
        loaded = _model_arguments(self.config[subcommand]) if subcommand else {}
        replaced = [f"{key} {value!r} -> {loaded[key]!r}" for key, value in given.items()
                    if key in loaded and loaded[key] != value]  # fmt: skip
        if replaced:  # Lightning replaces them silently, also those given on the command line
            rank_zero_warn(
                f"--ckpt_path {path}: the model is built with the checkpoint's hyperparameters, which replace these "
                f"model arguments: {', '.join(replaced)}."
            )

    def before_instantiate_classes(self) -> None:
        """Refuse an unknown strategy name and a missing price before anything is built; under torchrun, train on
        the nodes its rendezvous formed."""
        config = self._config()
        _nodes_of_the_rendezvous(config)
        strategy = config.get("trainer", {}).get("strategy")
        if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
            names = ", ".join(sorted(StrategyRegistry.available_strategies()))
            raise ConfigurationError(
                f"--trainer.strategy {strategy!r} is not a registered strategy; choose one of: {names}."
            )
        cost = config.get("cost")
        priced = cost is None or cost.init_args.get("price_per_hour") is not None
        if not priced and (cost.init_args.get("provider") is None or cost.init_args.get("instance_type") is None):
            raise ConfigurationError(
                "--cost needs the price of one node: --cost.price_per_hour 3.2, or --cost.provider gcp "
                "--cost.instance_type a2-highgpu-1g (add --cost.spot true on spot capacity); --cost null switches "
                "cost tracking off."
            )

    def instantiate_classes(self) -> None:
        """Build the classes; a bad argument refused by a lightning-scale class raises its usage error, which the
        command reports in one line, also where jsonargparse folds it into the strategy's error. W&B is not told the
        ``anonymous`` setting it would warn about when the user did not set it."""
        try:
            super().instantiate_classes()
        except ValueError as error:
            strategy = self._config()["trainer"].get("strategy")
            folded = None if isinstance(error, UsageError) else _strategy_usage_error(strategy)
            if folded is None:
                raise
            raise folded from None
        for logger in self.trainer.loggers:
            if isinstance(logger, WandbLogger):
                drop_unset_wandb_anonymous(logger)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        # a default switched off is None; one the user also added in --trainer.callbacks gives way to theirs
        callbacks = [c for c in callbacks if c is not None and not any(isinstance(g, type(c)) for g in given)]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
            callbacks.append(ScaleProgressBar())  # with the cost so far (CostTracker's progress_bar)
        return super()._instantiate_trainer(config, callbacks)


def _strategy_usage_error(strategy: Any) -> UsageError | None:
    """The usage error that ``strategy`` (a class path with init args) raises when built alone. jsonargparse builds
    ``--trainer.strategy`` as a union (``str | Strategy``) and keeps only the text of what the class raised, folded
    into an error of its own with a traceback (for callbacks it keeps the exception as the cause)."""
    class_path = getattr(strategy, "class_path", None)
    if not isinstance(class_path, str):
        return None
    module, _, name = class_path.rpartition(".")
    init_args = strategy.get("init_args")
    try:
        getattr(importlib.import_module(module), name)(**(init_args.as_dict() if init_args is not None else {}))
    except UsageError as error:
        return error
    except Exception:  # not a usage error: the original error is reported as it is
        return None
    return None


def _model_arguments(config: Any) -> dict[str, Any]:
    """The model's arguments in a subcommand's ``config``, by name (its ``init_args`` where it has a class path)."""
    model = config.get("model")
    arguments = model.as_dict() if hasattr(model, "as_dict") else {}
    return arguments.get("init_args") or {k: v for k, v in arguments.items() if k != "class_path"}


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
