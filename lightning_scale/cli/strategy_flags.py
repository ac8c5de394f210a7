"""Strategy names rewritten for jsonargparse: ``--trainer.strategy data_parallel`` followed by
``--trainer.strategy.<arg>`` flags becomes the class path, which jsonargparse opens to those flags."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy, PipelineParallelStrategy

    ScaleStrategy = DataParallelStrategy | ModelParallelStrategy | PipelineParallelStrategy

__all__ = ["strategy_names_as_class_paths"]

_STRATEGY_FLAG = "--trainer.strategy"


def strategy_names_as_class_paths(argv: list[str]) -> list[str]:
    """``argv`` with lightning-scale's strategy names (``--trainer.strategy data_parallel``, or the name in a
    ``--config`` file) given as their class paths where ``--trainer.strategy.<arg>`` flags follow: jsonargparse takes
    those after a class path only. The registered names take no arguments, so both forms build one strategy.

    Examples:
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
