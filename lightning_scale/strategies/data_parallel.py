"""``data_parallel``: Lightning's DDP, with a process group that survives torchrun restarts."""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_scale import distributed

__all__ = ["DataParallelStrategy"]


class DataParallelStrategy(DDPStrategy):
    """Distributed data parallel training, registered as ``data_parallel``.

    Compared with Lightning's ``ddp``: under ``torchrun --max-restarts`` the default process group is created with
    keys of its own for each restart, so restarted workers do not read the previous attempt's addresses from the
    agent's store (with stock ``ddp``, every restart after a SIGKILLed worker failed in gloo's ``connectFullMesh``
    unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` was set). On several nodes the agents count restarts separately,
    so there the environment variable is still needed. Everything else is Lightning's ``DDPStrategy``, with the same
    arguments; ZeRO-1 and gradient compression come with their issue.

    Example:
        >>> import lightning_scale  # registers the strategy
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(strategy="data_parallel", accelerator="cpu", devices=1, logger=False)
    """

    strategy_name = "data_parallel"

    @override
    def setup_distributed(self) -> None:
        self.set_world_ranks()
        distributed.init_process_group_per_attempt(
            self._get_process_group_backend(), self.global_rank, self.world_size, self._timeout
        )
        super().setup_distributed()  # Lightning keeps a group that already exists
