"""Lightning strategies of lightning-scale, registered in Lightning's StrategyRegistry when this package is imported.

``data_parallel`` is here; ``model_parallel`` and ``pipeline_parallel`` land with their issues.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_scale.strategies.data_parallel import DataParallelStrategy

__all__ = ["DataParallelStrategy"]

if DataParallelStrategy.strategy_name not in StrategyRegistry:
    StrategyRegistry.register(
        DataParallelStrategy.strategy_name,
        DataParallelStrategy,
        description="DDP whose process group survives torchrun restarts",
    )
