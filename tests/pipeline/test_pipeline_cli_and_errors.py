"""pipeline_parallel's refusals of bad arguments and of models it cannot split, before training, and one process
running the whole pipeline. Through the ``lightning-scale`` command: tests/cli/test_command.py (the example config, by
registry name, and a refusal under torchrun)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from torch import nn

from lightning_scale.strategies import PipelineParallelStrategy
from tests.pipeline.stack_model import StackModel, loader
from tests.pipeline.user_layouts import EmbeddingBlocksHead, FeaturesClassifier, FrozenPreprocessing, Preprocessed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "dualpipe"}, r"schedule='dualpipe' is not one of \['1f1b', 'gpipe'"),
        ({"schedule": "1f1b", "stages_per_rank": 2}, r"stages_per_rank=2 does not fit schedule='1f1b'"),
        ({"n_microbatches": 0}, r"n_microbatches=0 must be >= 1"),
        ({"pipeline_size": 0}, r"pipeline_size=0 must be >= 1"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PipelineParallelStrategy(**kwargs)


class NoLoss(StackModel):
    pipeline_loss_fn = None


class NoStack(StackModel):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("model", "strategy", "message"),
    [
        (NoLoss(), {}, r"needs pipeline_loss_fn\(output, target\)"),
        (
            StackModel(),
            {"module": "net"},
            r"has no attribute 'net'.*self\.net = nn\.Sequential\(\*self\.model\); or "
            r"name the stack .* PipelineParallelStrategy\(module=\.\.\.\)",
        ),
        (NoStack(), {}, r"splits an nn.Sequential or nn.ModuleList of blocks; got Linear"),
        (StackModel(depth=1), {"stages_per_rank": 4, "schedule": "interleaved_1f1b"}, r"3 blocks, fewer than"),
    ],
    ids=["no-loss", "wrong-attribute", "not-a-stack", "too-few-blocks"],
)
def test_a_model_the_strategy_cannot_split_is_refused_before_training(tmp_path, model, strategy, message):
    trainer = Trainer(accelerator="cpu", devices=1, strategy=PipelineParallelStrategy(**strategy), max_steps=1,
                      logger=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        trainer.fit(model, train_dataloaders=loader())


@pytest.mark.parametrize(
    ("model", "strategy", "message"),
    [
        (Preprocessed(), {}, r"trainable parameters are outside it: pre\.weight, pre\.bias\. .*"
                             r"self\.model = nn\.Sequential\(self\.pre, \*self\.model\)"),
        (EmbeddingBlocksHead(), {"module": "blocks"},
         r"outside it: embed\.weight, head\.weight, head\.bias\. .* an embedding first, a head last.*"
         r"self\.blocks = nn\.Sequential\(self\.embed, \*self\.blocks, self\.head\)"),
        (FeaturesClassifier(), {}, r"has no attribute 'model'.*embedding and head included.*"
                                   r"self\.model = nn\.Sequential\(\*self\.features, self\.classifier\)"),
    ],
    ids=["pre-processing-layer", "embedding-and-head-around-a-module-list", "features-and-classifier"],
)  # fmt: skip
def test_a_network_not_all_in_the_stack_is_refused_with_the_layout_that_works(tmp_path, model, strategy, message):
    trainer = Trainer(accelerator="cpu", devices=1, strategy=PipelineParallelStrategy(**strategy), max_steps=1,
                      logger=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        trainer.fit(model, train_dataloaders=loader())


def test_frozen_parameters_outside_the_stack_train_the_stack_with_a_warning(tmp_path):
    model = FrozenPreprocessing()
    before = model.pre.weight.clone()
    trainer = Trainer(accelerator="cpu", devices=1, strategy=PipelineParallelStrategy(), max_steps=2, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.warns(UserWarning, match=r"frozen parameters outside 'model' \(pre\.weight, pre\.bias\)"):
        trainer.fit(model, train_dataloaders=loader())
    assert torch.equal(model.pre.weight, before) and trainer.global_step == 2


def test_one_process_runs_the_whole_pipeline_as_one_stage(tmp_path):
    """On a laptop: pipeline_size 1, the schedule runs every microbatch through one stage; losses as without it."""
    from lightning.pytorch import seed_everything

    losses = {}
    for name, strategy in (("plain", "auto"), ("pipeline", PipelineParallelStrategy(schedule="gpipe"))):
        seed_everything(0)
        trainer = Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=3, logger=False,
                          enable_progress_bar=False, enable_checkpointing=False, default_root_dir=tmp_path,
                          use_distributed_sampler=False)  # fmt: skip
        trainer.fit(StackModel(), train_dataloaders=loader())
        losses[name] = float(trainer.callback_metrics["train_loss"])
    assert losses["pipeline"] == pytest.approx(losses["plain"], rel=1e-5)
