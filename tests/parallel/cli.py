"""LightningCLI over the example: ``python -m tests.parallel.cli fit --trainer.strategy data_parallel ...``."""

from lightning.pytorch.cli import LightningCLI

import lightning_scale  # noqa: F401  (registers data_parallel)
from examples.char_transformer import CharDataModule, CharTransformer

if __name__ == "__main__":
    LightningCLI(CharTransformer, CharDataModule)
