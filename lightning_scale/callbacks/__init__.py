"""Lightning callbacks of lightning-scale."""

from lightning_scale.callbacks.budgeted_early_stopping import BudgetedEarlyStopping
from lightning_scale.callbacks.cost_tracker import CostTracker
from lightning_scale.callbacks.data_state import DataStateCheckpoint
from lightning_scale.callbacks.divergence_rollback import DivergenceRollback
from lightning_scale.callbacks.hang_watchdog import HangWatchdog
from lightning_scale.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_scale.callbacks.spot_preemption import SpotPreemption
from lightning_scale.callbacks.straggler_detector import StragglerDetector
from lightning_scale.callbacks.wandb_resume import WandbResume

__all__ = [
    "BudgetedEarlyStopping",
    "CostTracker",
    "DataStateCheckpoint",
    "DivergenceRollback",
    "HangWatchdog",
    "ResumableCheckpoint",
    "SpotPreemption",
    "StragglerDetector",
    "WandbResume",
]
