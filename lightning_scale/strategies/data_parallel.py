"""``data_parallel``: Lightning's DDP with ZeRO-1, gradient compression, and a process group that survives restarts."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale.checkpoint.rank_local import per_rank, saving_per_rank
from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.data import (
    COMPRESSIONS,
    SHARDS_KEY,
    Compression,
    CompressionHook,
    PowerSGDHook,
    check_powersgd_settings,
    compression_hook,
    own_share,
    shard_optimizer,
    sharded_state_dict,
    whole_state_dict,
)

__all__ = ["DataParallelStrategy"]

_HOOK_STATE_KEY = "lightning_scale_grad_compression"


class DataParallelStrategy(DDPStrategy):
    """Distributed data parallel training, registered as ``data_parallel``.

    Lightning's ``DDPStrategy`` (same arguments), plus:

    - ``zero_stage=1``: the optimizer state is sharded across the ranks (torch's ``ZeroRedundancyOptimizer`` around
      the optimizer ``configure_optimizers`` returns; LR schedulers follow it). In sharded checkpoints (the default
      with ``ResumableCheckpoint``) each rank saves its own share, with no collective; single files hold the state
      consolidated on rank 0. Either resumes on another world size, with or without ZeRO (the shares are merged
      while loading; on the same world size each rank reads its own only).
    - ``grad_compression``: ``fp16`` or ``bf16`` (gradients all-reduced in half precision, on gloo too) or
      ``powersgd`` (low-rank, error feedback; its state is saved with the optimizer state so resume is exact on the
      same world size), registered on the DDP module on CPU and GPU alike (Lightning's ``ddp_comm_hook`` argument
      acts on CUDA only).
    - Accumulating steps (``accumulate_grad_batches``) skip the all-reduce: Lightning runs them under DDP's
      ``no_sync``, and the last step of each accumulation reduces the summed gradients once.
    - Under ``torchrun --max-restarts`` the default process group gets keys of its own for each restart, so restarted
      workers do not read the previous attempt's addresses from the agent's store (with stock ``ddp``, every restart
      after a SIGKILLed worker failed in gloo's ``connectFullMesh`` unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
      was set). On several nodes the agents count restarts separately, so there the variable is still needed.

    Args:
        zero_stage: 0 (every rank holds the whole optimizer state) or 1 (each rank holds its shard).
        grad_compression: ``none``, ``fp16``, ``bf16`` or ``powersgd``.
        powersgd_rank: Rank of PowerSGD's low-rank approximation (higher: closer to uncompressed, more traffic).
        powersgd_warmup_steps: Optimizer steps of plain all-reduce before PowerSGD starts compressing.
        **kwargs: Lightning's ``DDPStrategy`` arguments.

    Example:
        >>> import lightning_scale  # registers the strategy
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(strategy="data_parallel", accelerator="cpu", devices=1, logger=False)
        >>> strategy = DataParallelStrategy(zero_stage=1, grad_compression="powersgd", powersgd_rank=2)
    """

    strategy_name = "data_parallel"

    def __init__(
        self,
        zero_stage: Literal[0, 1] = 0,
        grad_compression: Compression = "none",
        powersgd_rank: int = 1,
        powersgd_warmup_steps: int = 1000,
        **kwargs: Any,
    ) -> None:
        if zero_stage not in (0, 1):
            raise ConfigurationError(
                f"zero_stage={zero_stage!r}: data_parallel shards the optimizer state (1) or not (0); for sharded "
                "parameters and gradients use strategy='model_parallel' (--trainer.strategy.zero_stage)."
            )
        if grad_compression not in COMPRESSIONS:
            raise ConfigurationError(
                f"grad_compression={grad_compression!r} is not one of {list(COMPRESSIONS)} "
                "(--trainer.strategy.grad_compression)."
            )
        check_powersgd_settings(powersgd_rank, powersgd_warmup_steps)
        if grad_compression != "none" and kwargs.get("ddp_comm_hook") is not None:
            raise ConfigurationError(
                "Pass either grad_compression or ddp_comm_hook, not both: each registers a DDP hook."
            )
        super().__init__(**kwargs)
        self.zero_stage = zero_stage
        self.grad_compression = grad_compression
        self.powersgd_rank = powersgd_rank
        self.powersgd_warmup_steps = powersgd_warmup_steps
        self._hook: CompressionHook | None = None

    @override
    def setup_distributed(self) -> None:
        self.set_world_ranks()
        backend = self._get_process_group_backend()
        # checked before the process group starts: an unsupported compression fails before any work
        self._hook = compression_hook(self.grad_compression, backend, self.powersgd_rank, self.powersgd_warmup_steps)
        distributed.init_process_group_per_attempt(backend, self.global_rank, self.world_size, self._timeout)
        super().setup_distributed()  # Lightning keeps a group that already exists

    @override
    def configure_ddp(self) -> None:
        super().configure_ddp()
        if self._hook is None:
            return
        model = self.model
        assert isinstance(model, DistributedDataParallel), "Lightning's configure_ddp wraps the model in DDP"
        if self._hook.powersgd is not None:
            self._hook.powersgd.bind(model.parameters())
        model.register_comm_hook(self._hook.state, self._hook.hook)

    @override
    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        super().setup_optimizers(trainer)
        if self.zero_stage == 0:
            return
        sharded: list[Optimizer] = []
        for optimizer in self.optimizers:
            zero = shard_optimizer(optimizer)
            for config in self.lr_scheduler_configs:  # schedulers set the learning rate on the optimizer they hold
                if config.scheduler.optimizer is optimizer:
                    config.scheduler.optimizer = zero
            sharded.append(zero)
        self.optimizers = sharded

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        unwrapped = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        state: dict[str, Any]
        if self.zero_stage == 1 and saving_per_rank():  # each rank writes its own share: no collective
            state = sharded_state_dict(unwrapped, per_rank(own_share(unwrapped)))  # type: ignore[arg-type]
        else:
            state = super().optimizer_state(optimizer)  # ZeRO: consolidated on rank 0 (a collective)
        powersgd = self._powersgd()
        if powersgd is not None and self._is_first(optimizer):
            ranks = per_rank(powersgd.state_dict())  # it differs per rank
            state = {**state, _HOOK_STATE_KEY: {"world_size": self.world_size, "ranks": ranks}}
        return state

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        states = [self._whole(dict(state)) for state in checkpoint["optimizer_states"]]
        saved = states[0].pop(_HOOK_STATE_KEY, None) if states else None
        powersgd = self._powersgd()
        if saved is not None and powersgd is not None:
            if saved["world_size"] == self.world_size:
                powersgd.load_state_dict(saved["ranks"][self.global_rank])
            else:
                rank_zero_warn(
                    f"The checkpoint's PowerSGD error feedback comes from {saved['world_size']} ranks, this run has "
                    f"{self.world_size}: compression restarts from fresh state, so this resume is not exact."
                )
        super().load_optimizer_state_dict({**checkpoint, "optimizer_states": states})

    def _whole(self, state: dict[str, Any]) -> dict[str, Any]:
        """The consolidated optimizer state of each rank's saved share; under ZeRO on the saving world size, this
        rank's share is all it keeps (and all it reads)."""
        shares = state.get(SHARDS_KEY)
        same_partition = shares is not None and self.zero_stage == 1 and len(shares) == self.world_size
        return whole_state_dict(state, only_rank=self.global_rank if same_partition else None)

    def _powersgd(self) -> PowerSGDHook | None:
        return self._hook.powersgd if self._hook is not None else None

    def _is_first(self, optimizer: Optimizer) -> bool:
        first = self.optimizers[0]
        return (first.optimizer if isinstance(first, LightningOptimizer) else first) is optimizer
