"""Warm restarts: each rank's parent process outlives its training processes and restarts them after a failure,
without the interpreter start, the imports and torchrun's restart (:mod:`~lightning_scale.restart.supervisor`), over
keys that the parents share (:mod:`~lightning_scale.restart.board`)."""

from lightning_scale.restart.board import AttemptBoard
from lightning_scale.restart.supervisor import FINAL_EXIT_CODES, Supervisor, supervise, warm_restarts_apply

__all__ = ["FINAL_EXIT_CODES", "AttemptBoard", "Supervisor", "supervise", "warm_restarts_apply"]
