"""LightningCLI over StackModel: ``python -m tests.pipeline.cli fit --trainer.strategy pipeline_parallel ...``."""

from lightning.pytorch.cli import LightningCLI

import lightning_scale  # noqa: F401  (registers pipeline_parallel)
from tests.pipeline.stack_model import StackData, StackModel

if __name__ == "__main__":
    LightningCLI(StackModel, StackData)
