"""Lightning strategies of lightning-scale, registered in Lightning's StrategyRegistry when this package is imported.

``data_parallel``, ``model_parallel`` and ``pipeline_parallel``.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_scale.strategies.data_parallel import DataParallelStrategy
from lightning_scale.strategies.model_parallel import ModelParallelStrategy
from lightning_scale.strategies.pipeline_parallel import PipelineParallelStrategy

__all__ = ["DataParallelStrategy", "ModelParallelStrategy", "PipelineParallelStrategy"]

for _strategy, _description in (
    (DataParallelStrategy, "DDP with ZeRO-1/2 and gradient compression; its process group survives torchrun restarts"),
    (ModelParallelStrategy, "FSDP2 sharding and tensor parallelism for a plain LightningModule"),
    (PipelineParallelStrategy, "pipeline parallelism with torch.distributed.pipelining schedules"),
):
    if _strategy.strategy_name not in StrategyRegistry:
        StrategyRegistry.register(_strategy.strategy_name, _strategy, description=_description)
