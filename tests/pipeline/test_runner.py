"""The step runner without a Trainer: one process in a one-rank gloo group runs every schedule, its stages on this
rank, and must agree with the unsplit stack run directly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightning_scale.parallel.pipeline import SCHEDULES, PipelineRunner, inputs_and_target, plan_stages, split_module_

BATCH, IN, OUT = 8, 4, 3


@pytest.fixture
def group() -> Iterator[Any]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD  # the conftest fixture destroys it


class Holder(nn.Module):
    """What the strategy splits: a module holding its stack of blocks under ``model``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, OUT))


def runner_and_reference(schedule: str, group: Any, n_microbatches: int = 4) -> tuple[PipelineRunner, nn.Module]:
    """A runner over every stage of ``schedule`` on this rank, and an unsplit copy of the same weights."""
    torch.manual_seed(0)
    holder = Holder()
    reference = Holder()
    reference.load_state_dict(holder.state_dict())
    spec = SCHEDULES[schedule]
    num_stages = spec.stages_per_rank(None)
    plan = plan_stages(holder.model, num_stages, pipeline_size=1, style=spec.rank_layout)
    stages = split_module_(holder, "model", plan, pipeline_rank=0, device=torch.device("cpu"), seed=0)
    runner = PipelineRunner(spec, plan, stages, 0, torch.device("cpu"), group, n_microbatches, F.cross_entropy)
    return runner, reference


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, IN, generator=generator), torch.randint(0, OUT, (BATCH,), generator=generator)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_train_step_gives_the_mean_microbatch_loss_and_the_full_batch_gradients(schedule, group):
    runner, reference = runner_and_reference(schedule, group)
    x, y = batch()
    loss = runner.run("train", *inputs_and_target((x, y), None))
    expected = F.cross_entropy(reference.model(x), y)  # equal microbatches: the mean of their means
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    stages = [module for _, module in sorted(runner.stage_modules.items())]
    got = {name: p.grad for stage in stages for name, p in stage.named_parameters()}
    for name, p in reference.model.named_parameters():
        torch.testing.assert_close(got[name], p.grad)
    runner.close()


# torch 2.13: a looped schedule's eval() hands an activation to the next stage on the same rank by stealing its
# backward input, which a forward-only stage lacks. On two or more ranks no looped stage has its successor on the same
# rank (tests/pipeline/test_pipeline_parallel.py evaluates and predicts with them); on one rank each one has, so
# pipeline_parallel with pipeline_size=1 and a looped multi-stage schedule cannot evaluate yet.
SAME_RANK_HANDOFF = {name for name, spec in SCHEDULES.items() if spec.multi_stage and spec.rank_layout == "looped"}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_evaluation_and_prediction_run_forward_only(schedule, group):
    runner, reference = runner_and_reference(schedule, group)
    x, y = batch()
    if schedule in SAME_RANK_HANDOFF:  # torch's own refusal, not a wrong result: when torch lifts it, this fails
        with torch.inference_mode(), pytest.raises(AssertionError, match="can't steal_bwd_input if this stage doesn't"):
            runner.run("eval", (x,), y)
        return
    with torch.inference_mode():  # as Lightning's evaluation and prediction loops run
        loss, output = runner.run("eval", (x,), y), runner.predict((x,))
        torch.testing.assert_close(loss, F.cross_entropy(reference.model(x), y))
        torch.testing.assert_close(output, reference.model(x))
    assert all(p.grad is None for module in runner.stage_modules.values() for p in module.parameters())
    assert runner.last_stage_rank == 0 and runner.runs_stage(0) and runner.runs_stage(-1)


def test_each_batch_size_gets_its_own_schedule_and_a_size_the_microbatches_do_not_divide_is_refused(group):
    runner, reference = runner_and_reference("1f1b", group, n_microbatches=2)
    x, y = batch()
    for rows in (BATCH, BATCH // 2):  # stages fix their shapes on first use: a smaller last batch needs new ones
        loss = runner.run("eval", (x[:rows],), y[:rows])
        torch.testing.assert_close(loss, F.cross_entropy(reference.model(x[:rows]), y[:rows]).detach())
    with pytest.raises(
        ValueError, match=r"n_microbatches=2 does not divide the batch size 5; choose a divisor such as"
    ):
        runner.run("train", (x[:5],), y[:5])
    runner.close()
    runner.close()  # safe twice


def test_a_batch_without_a_target_needs_pipeline_split_batch():
    with pytest.raises(ValueError, match="cannot tell inputs from target in a batch of type dict"):
        inputs_and_target({"x": torch.zeros(2)}, None)
    inputs, target = inputs_and_target({"x": torch.zeros(2), "y": torch.ones(2)}, lambda b: (b["x"], b["y"]))
    assert len(inputs) == 1 and torch.equal(target, torch.ones(2))
