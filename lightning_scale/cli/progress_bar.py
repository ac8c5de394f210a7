"""The command's progress bar: Rich's, with the cost so far (``CostTracker`` shows it in the bar's metrics)."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override

__all__ = ["ScaleProgressBar"]


class ScaleProgressBar(RichProgressBar):
    """Rich's progress bar, whose epoch reads ``Epoch 13`` where training is bounded by steps only: Lightning's reads
    ``Epoch 13/-2`` when ``max_steps`` is set without ``max_epochs`` (its ``max_epochs`` is then ``-1``)."""

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        description = super()._get_train_description(current_epoch)
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            description = description.replace(
                f"Epoch {current_epoch}/{self.trainer.max_epochs - 1}", f"Epoch {current_epoch}"
            )
        return description
