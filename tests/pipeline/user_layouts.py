"""Users' modules whose network is not all in one stack: what pipeline_parallel must refuse (or warn about)."""

from __future__ import annotations

from torch import nn

from tests.pipeline.stack_model import IN, OUT, VOCAB, StackModel


class Preprocessed(StackModel):
    """A user's module: a pre-processing layer in front of the stack it defines as ``model``."""

    def __init__(self):
        super().__init__()
        stack = self.model
        del self.model
        self.pre = nn.Linear(IN, IN)  # defined before the stack, as forward() uses them
        self.model = stack

    def forward(self, x):
        return self.model(self.pre(x))


class FrozenPreprocessing(Preprocessed):
    def __init__(self):
        super().__init__()
        self.pre.requires_grad_(False)


class EmbeddingBlocksHead(StackModel):
    """A usual language-model layout: an embedding and a head around an nn.ModuleList of blocks."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.blocks = nn.ModuleList(list(self.model.children())[1:-1])
        self.head = nn.Linear(32, OUT)
        del self.model


class FeaturesClassifier(StackModel):
    """A usual vision layout: ``features`` and ``classifier``, no single stack."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(*list(self.model.children())[:-1])
        self.classifier = nn.Linear(32, OUT)
        del self.model
