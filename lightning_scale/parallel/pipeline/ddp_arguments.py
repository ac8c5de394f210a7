"""Which of ``DDPStrategy``'s arguments a pipeline takes: the process-level ones. The others configure DDP's model
wrapper, which a pipeline has not; set to anything but the wrapper's defaults, they would silently do nothing."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from lightning_scale.errors import ConfigurationError

__all__ = ["refuse_wrapper_arguments"]

PROCESS_ARGUMENTS = frozenset({"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io",
                               "precision_plugin", "timeout", "start_method"})  # fmt: skip
"""``DDPStrategy`` arguments that apply to a pipeline too."""

_WRAPPER_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(DistributedDataParallel.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}
"""The wrapper's arguments as they are when nobody sets them (the command line passes them all)."""


def refuse_wrapper_arguments(kwargs: Mapping[str, Any]) -> None:
    """Raise ``ConfigurationError`` naming the DDP wrapper arguments in ``kwargs`` set off their defaults.

    Examples:
        >>> refuse_wrapper_arguments({"timeout": None, "find_unused_parameters": False})  # the defaults: accepted
    """
    ddp_only = {name for name, value in kwargs.items() if value != _WRAPPER_DEFAULTS.get(name)} - PROCESS_ARGUMENTS
    if ddp_only:
        raise ConfigurationError(
            f"pipeline_parallel runs a pipeline schedule and does not wrap the model in DDP, so {sorted(ddp_only)} "
            "would do nothing: drop them (its replicas average their gradients themselves)."
        )
