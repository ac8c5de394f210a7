"""Lightning strategies of lightning-scale, registered in Lightning's StrategyRegistry when this package is imported.

``data_parallel`` and ``pipeline_parallel`` are here; ``model_parallel`` lands with its issue.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_scale.strategies.data_parallel import DataParallelStrategy
from lightning_scale.strategies.pipeline_parallel import PipelineParallelStrategy

__all__ = ["DataParallelStrategy", "PipelineParallelStrategy"]

for _strategy, _description in (
    (DataParallelStrategy, "DDP whose process group survives torchrun restarts"),
    (PipelineParallelStrategy, "pipeline parallelism with torch.distributed.pipelining schedules"),
):
    if _strategy.strategy_name not in StrategyRegistry:
        StrategyRegistry.register(_strategy.strategy_name, _strategy, description=_description)
