"""lightning-scale: plugins for PyTorch Lightning that make training at scale safe and cheap.

Importing it registers its strategies with Lightning (``Trainer(strategy="data_parallel")``).
"""

from lightning_scale._collector import imports_frozen

with imports_frozen():  # Lightning's and torch's objects out of the garbage collector's way (its docstring: why)
    from lightning_scale._warnings import ignore_library_warnings
    from lightning_scale.callbacks import (
        BudgetedEarlyStopping,
        CostTracker,
        DataStateCheckpoint,
        DivergenceRollback,
        ResumableCheckpoint,
        SpotPreemption,
        WandbResume,
    )
    from lightning_scale.data import WorkerRNGDataset
    from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy, PipelineParallelStrategy

__version__ = "0.1.0"

ignore_library_warnings()

__all__ = [
    "BudgetedEarlyStopping",
    "CostTracker",
    "DataParallelStrategy",
    "DataStateCheckpoint",
    "DivergenceRollback",
    "ModelParallelStrategy",
    "PipelineParallelStrategy",
    "ResumableCheckpoint",
    "SpotPreemption",
    "WandbResume",
    "WorkerRNGDataset",
    "__version__",
]
