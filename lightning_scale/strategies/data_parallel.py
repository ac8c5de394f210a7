"""``data_parallel``: Lightning's DDP with ZeRO-1/2, gradient compression, and a process group that survives
restarts."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from lightning_scale import distributed
from lightning_scale._lightning_internals import route_norm_clipping
from lightning_scale.checkpoint.rank_local import per_rank, saving_per_rank
from lightning_scale.errors import ConfigurationError
from lightning_scale.parallel.data import (
    COMPRESSIONS,
    Compression,
    CompressionHook,
    PowerSGDHook,
    ZeroSharding,
    check_powersgd_settings,
    chunked_state_dict,
    compression_hook,
    own_chunks,
    sharded_state_dict,
    whole_state_dict,
)

__all__ = ["DataParallelStrategy"]

_HOOK_STATE_KEY = "lightning_scale_grad_compression"
_REDUCE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class DataParallelStrategy(DDPStrategy):
    """Distributed data parallel training, registered as ``data_parallel``.

    Lightning's ``DDPStrategy`` (same arguments), plus:

    - ``zero_stage=1`` or ``2``: each rank owns a 1/world-size chunk of every parameter and keeps the optimizer
      state of its chunks only (the optimizer ``configure_optimizers`` returns, rebuilt over the chunks; LR
      schedulers follow it). Gradients are reduce-scattered into the chunks in buckets while backward runs and the
      updated chunks all-gathered after each step: the traffic of one all-reduce
      (:class:`~lightning_scale.parallel.data.ZeroSharding`). Stage 2 also frees every full gradient as soon as it
      is reduced, accumulating steps included; stage 1 accumulates locally and reduces once per step, like
      ``no_sync``. The model's ``.grad`` are ``None`` after backward: the reduced gradients are on the optimizer's
      parameters (``gradient_clip_val`` clips by the norm over all ranks). Optimizers must update each element on
      its own (SGD, Adam, AdamW, RMSprop, ...); parameters must be contiguous. In sharded checkpoints (the default
      with ``ResumableCheckpoint``) each rank saves its own chunks, with no collective; single files hold the state
      merged on rank 0. Either resumes on another world size, with or without ZeRO.
    - ``grad_compression``: ``fp16`` or ``bf16`` (gradients all-reduced in half precision, on gloo too) or
      ``powersgd`` (low-rank, error feedback; its state is saved with the optimizer state so resume is exact on the
      same world size), registered on the DDP module on CPU and GPU alike (Lightning's ``ddp_comm_hook`` argument
      acts on CUDA only).
    - Accumulating steps (``accumulate_grad_batches``) skip the all-reduce: Lightning runs them under DDP's
      ``no_sync``, and the last step of each accumulation reduces the summed gradients once (ZeRO-2 excepted).
    - Under ``torchrun --max-restarts`` the default process group gets keys of its own for each restart, so restarted
      workers do not read the previous attempt's addresses from the agent's store (with stock ``ddp``, every restart
      after a SIGKILLed worker failed in gloo's ``connectFullMesh`` unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
      was set). On several nodes the agents count restarts separately, so there the variable is still needed.

    Args:
        zero_stage: 0 (every rank holds the whole optimizer state), 1 (its chunk of it) or 2 (and of the gradients).
        grad_compression: ``none``, ``fp16``, ``bf16`` or ``powersgd`` (not with ZeRO).
        powersgd_rank: Rank of PowerSGD's low-rank approximation (higher: closer to uncompressed, more traffic).
        powersgd_warmup_steps: Optimizer steps of plain all-reduce before PowerSGD starts compressing.
        **kwargs: Lightning's ``DDPStrategy`` arguments.

    Examples:
        >>> import lightning_scale  # registers the strategy
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(strategy="data_parallel", accelerator="cpu", devices=1, logger=False)
        >>> strategy = DataParallelStrategy(zero_stage=2, grad_compression="bf16")
    """

    strategy_name = "data_parallel"

    def __init__(
        self,
        zero_stage: Literal[0, 1, 2] = 0,
        grad_compression: Compression = "none",
        powersgd_rank: int = 1,
        powersgd_warmup_steps: int = 1000,
        **kwargs: Any,
    ) -> None:
        if zero_stage not in (0, 1, 2):
            raise ConfigurationError(
                f"zero_stage={zero_stage!r}: data_parallel shards the optimizer state (1), and the gradients (2), or "
                "nothing (0); for sharded parameters use strategy='model_parallel' (--trainer.strategy.zero_stage)."
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
        if zero_stage and (grad_compression == "powersgd" or kwargs.get("ddp_comm_hook") is not None):
            what = "grad_compression='powersgd'" if grad_compression == "powersgd" else "ddp_comm_hook"
            raise ConfigurationError(
                f"zero_stage={zero_stage} reduce-scatters gradients itself, so {what} cannot act; use "
                "grad_compression='fp16' or 'bf16' with ZeRO, or zero_stage=0."
            )
        super().__init__(**kwargs)
        self.zero_stage = zero_stage
        self.grad_compression = grad_compression
        self.powersgd_rank = powersgd_rank
        self.powersgd_warmup_steps = powersgd_warmup_steps
        self._hook: CompressionHook | None = None
        self._zero: list[ZeroSharding] = []
        # DDP's arguments ZeRO honours (None, as LightningCLI passes unset ones, is DDP's default bucket size)
        self._bucket_cap_mb: float = kwargs.get("bucket_cap_mb") or 25
        self._broadcast_buffers = kwargs.get("broadcast_buffers", True)
        self._buffers: list[torch.Tensor] = []
        self._unroute_clipping: Callable[[], Any] = lambda: None

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
        if self.zero_stage:  # no DDP wrapper: ZeroSharding reduces the gradients; rank 0's weights to start with
            assert self.model is not None
            # the buffers rank 0 sends each step, found once, as DDP does when it wraps the model
            self._buffers = list(self.model.buffers()) if self._broadcast_buffers else []
            distributed.broadcast_([*self.model.parameters(), *self.model.buffers()])
            return
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
        if getattr(self.precision_plugin, "scaler", None) is not None:
            raise ConfigurationError(
                "zero_stage with a gradient scaler (precision='16-mixed'): each rank sees only its chunks' gradients, "
                "so ranks would disagree on which steps to skip. Use precision='bf16-mixed', or zero_stage=0."
            )
        bucket_bytes = int(self._bucket_cap_mb * 2**20)
        self._close_zero()
        for optimizer in self.optimizers:
            try:
                zero = ZeroSharding(optimizer, self.zero_stage, bucket_bytes, _REDUCE_DTYPES[self.grad_compression])
            except ValueError as err:
                raise ConfigurationError(f"{err} (--trainer.strategy.zero_stage)") from None
            for config in self.lr_scheduler_configs:  # schedulers set the learning rate on the optimizer they hold
                if config.scheduler.optimizer is optimizer:
                    config.scheduler.optimizer = zero.optimizer
            self._zero.append(zero)
        self.optimizers = [zero.optimizer for zero in self._zero]
        self._unroute_clipping = route_norm_clipping(self.precision_plugin, self._clip_by_norm)

    def _clip_by_norm(self, optimizer: Optimizer, max_norm: float) -> bool:
        zero = self._sharding(optimizer)
        if zero is not None:
            zero.clip_grad_norm_(max_norm)
        return zero is not None

    @override
    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        if not self._zero:
            with super().block_backward_sync():
                yield
            return
        for zero in self._zero:
            zero.sync = False
        try:
            yield
        finally:
            for zero in self._zero:
                zero.sync = True

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._zero and self._buffers:  # as DDP: rank 0's buffers each step
            distributed.broadcast_(self._buffers)
        return super().training_step(*args, **kwargs)

    @override
    def teardown(self) -> None:
        for zero in self._zero:  # unhooked; kept for the optimizer's state (a checkpoint saved after fit)
            zero.close()
        self._unroute_clipping()
        super().teardown()

    def _close_zero(self) -> None:
        for zero in self._zero:
            zero.close()
        self._zero = []
        self._unroute_clipping()

    @property
    def shardings(self) -> list[ZeroSharding]:
        """Under ZeRO, the sharding of each optimizer (its state, its buffers, where its time went); else empty."""
        return list(self._zero)

    def _sharding(self, optimizer: Optimizer) -> ZeroSharding | None:
        unwrapped = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        return next((zero for zero in self._zero if zero.optimizer is unwrapped), None)

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        unwrapped = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        zero = self._sharding(unwrapped)
        state: dict[str, Any]
        if zero is not None:  # a sharded save: each rank its own chunks; one file: merged on rank 0 (a gather)
            state = sharded_state_dict(unwrapped, per_rank(own_chunks(zero)))
            state = state if saving_per_rank() else whole_state_dict(state) if self.is_global_zero else {}
        else:
            state = super().optimizer_state(optimizer)
        powersgd = self._powersgd()
        if powersgd is not None and self._is_first(optimizer):
            ranks = per_rank(powersgd.state_dict())  # it differs per rank
            state = {**state, _HOOK_STATE_KEY: {"world_size": self.world_size, "ranks": ranks}}
        return state

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        if self._zero:
            for zero, state in zip(self._zero, checkpoint["optimizer_states"], strict=True):
                zero.optimizer.load_state_dict(chunked_state_dict(state, zero))
            return
        states = [whole_state_dict(dict(state)) for state in checkpoint["optimizer_states"]]
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

    def _powersgd(self) -> PowerSGDHook | None:
        return self._hook.powersgd if self._hook is not None else None

    def _is_first(self, optimizer: Optimizer) -> bool:
        first = self.optimizers[0]
        return (first.optimizer if isinstance(first, LightningOptimizer) else first) is optimizer
