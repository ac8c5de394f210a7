"""``model_parallel``: FSDP2 sharding (+ optional tensor parallelism) for a plain LightningModule, on CPU and GPU."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.strategies import ModelParallelStrategy as LightningModelParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import configure_model_stand_in
from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.model import (
    apply_fsdp,
    apply_tensor_parallel,
    default_tensor_parallel_plan,
    is_parallelized,
    sharding_units,
)

__all__ = ["ModelParallelStrategy"]


class ModelParallelStrategy(LightningModelParallelStrategy):
    """FSDP2 over data-parallel ranks, tensor parallelism within groups, registered as ``model_parallel``.

    Lightning's ``ModelParallelStrategy`` needs a hand-written ``configure_model``; this one shards a plain
    LightningModule itself (a user's ``configure_model`` still wins):

    - FSDP2 (``fully_shard``) on each block of every ``nn.ModuleList`` (or, without one, each child holding at least
      ``min_params_to_shard`` parameters), then on the LightningModule: parameters, gradients and optimizer state are
      split across the ``data_parallel`` ranks.
    - With ``tensor_parallel_size > 1``, ranks form a ``(data_parallel, tensor_parallel)`` mesh; inside each block,
      MLPs (two chained ``nn.Linear`` in an ``nn.Sequential``) are split column- then row-wise across the
      ``tensor_parallel`` ranks, or as the LightningModule's ``tensor_parallel_plan()`` says (``{module name:
      ParallelStyle}`` for ``parallelize_module``). Modules outside the plan are replicated on those ranks.
    - Checkpoints are Lightning's for this strategy: with ``save_distributed_checkpoint=True`` (default) a directory
      of shards written by every rank through ``torch.distributed.checkpoint``, which loads on another world size
      (resharding) and consolidates into one file with :func:`lightning_scale.checkpoint.consolidate_checkpoint`.
    - Under ``torchrun --max-restarts`` the process group survives restarts, as with ``data_parallel``.

    Args:
        tensor_parallel_size: Ranks per tensor-parallel group; must divide the world size (the rest is data parallel).
            ``"auto"``: the processes of one node, as in Lightning's class (whose default it is; here it is 1).
        data_parallel_size: ``"auto"`` (the world size over ``tensor_parallel_size``), or that number, checked.
        min_params_to_shard: Without an ``nn.ModuleList``, children below this many parameters stay in the root unit.
        save_distributed_checkpoint: A directory of shards (``True``) or one file assembled on rank 0 (``False``).
        process_group_backend: ``gloo`` or ``nccl`` (default: by device).
        **kwargs: ``timeout`` of collectives.

    Examples:
        >>> import lightning_scale  # registers the strategy
        >>> strategy = ModelParallelStrategy(tensor_parallel_size=2)
    """

    strategy_name = "model_parallel"

    def __init__(
        self,
        tensor_parallel_size: int | Literal["auto"] = 1,
        min_params_to_shard: int = 100_000,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        data_parallel_size: int | Literal["auto"] = "auto",
        **kwargs: Any,
    ) -> None:
        for name, size in (("tensor_parallel_size", tensor_parallel_size), ("data_parallel_size", data_parallel_size)):
            if size != "auto" and not (isinstance(size, int) and size >= 1):
                raise ConfigurationError(f"{name}={size!r} must be >= 1 or 'auto' (--trainer.strategy.{name}).")
        if min_params_to_shard < 1:
            raise ConfigurationError(f"min_params_to_shard={min_params_to_shard} must be >= 1.")
        super().__init__(
            data_parallel_size=1,  # both set from the world size once it is known
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            **kwargs,
        )
        self.tensor_parallel_size = tensor_parallel_size
        self.data_parallel_size = data_parallel_size
        self.min_params_to_shard = min_params_to_shard

    @override
    def setup_environment(self) -> None:
        self.set_world_ranks()
        tensor = self.num_processes if self.tensor_parallel_size == "auto" else self.tensor_parallel_size
        if self.world_size % tensor:
            raise ConfigurationError(
                f"tensor_parallel_size={tensor} does not divide the world size {self.world_size}; "
                "choose a divisor (--trainer.strategy.tensor_parallel_size), the rest becomes data parallel."
            )
        data = self.world_size // tensor
        if self.data_parallel_size not in ("auto", data):
            raise ConfigurationError(
                f"data_parallel_size={self.data_parallel_size} times tensor_parallel_size={tensor} is not the world "
                f"size {self.world_size}; leave data_parallel_size='auto' (the default) to use the rest, {data}."
            )
        self._tensor_parallel_size, self._data_parallel_size = tensor, data
        distributed.init_process_group_per_attempt(
            self._get_process_group_backend(), self.global_rank, self.world_size, self._timeout
        )
        super().setup_environment()  # Lightning keeps a group that already exists and builds the device mesh

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        module = self.lightning_module
        assert module is not None, "the Trainer attaches the LightningModule before the strategy's setup"
        if is_overridden("configure_model", module):  # the user parallelised the model: Lightning's behaviour
            super().setup(trainer)
            return
        if not is_parallelized(module):  # fit, then test on the same Trainer: shard once
            self._parallelize(module)
        with configure_model_stand_in(module):  # Lightning's setup insists on one
            super().setup(trainer)

    def _parallelize(self, module: pl.LightningModule) -> None:
        units = sharding_units(module, self.min_params_to_shard)
        mesh = self.device_mesh
        assert isinstance(self._tensor_parallel_size, int), "setup_environment resolved 'auto'"
        if self._tensor_parallel_size > 1:
            plan_hook = getattr(module, "tensor_parallel_plan", None)
            plan = plan_hook() if callable(plan_hook) else default_tensor_parallel_plan(module, units)
            apply_tensor_parallel(module, mesh["tensor_parallel"], plan)
            rank_zero_info(f"model_parallel: tensor parallel over {self._tensor_parallel_size} ranks: {sorted(plan)}")
        apply_fsdp(module, units, mesh["data_parallel"])
        names = ", ".join(name for name, _ in units)
        rank_zero_info(f"model_parallel: FSDP2 over {self._data_parallel_size} ranks, units: {names} and the root")
