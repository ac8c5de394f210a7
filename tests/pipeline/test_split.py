"""Stage planning: balanced contiguous stages, rank layouts, names kept, errors that name the fix."""

from __future__ import annotations

import pytest
from torch import nn

from lightning_scale.parallel.pipeline import balanced_partition, plan_stages, stage_ranks


def test_partition_minimises_the_largest_stage():
    assert balanced_partition([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert balanced_partition([8, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 9)]
    assert balanced_partition([3, 3, 3, 1, 1, 1], 3) == [(0, 1), (1, 2), (2, 6)]
    with pytest.raises(ValueError, match="Cannot split 2 blocks into 3"):
        balanced_partition([1, 1], 3)


def test_looped_and_v_shaped_rank_layouts():
    assert stage_ranks(4, 2, "looped") == [0, 1, 0, 1]
    assert stage_ranks(4, 2, "v") == [0, 1, 1, 0]


def test_local_stack_keeps_the_original_names():
    stack = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
    plan = plan_stages(stack, num_stages=4, pipeline_size=2, style="looped")
    local = plan.local_stack(stack, pipeline_rank=1)
    names = [name for name, _ in local.named_children()]
    assert names == [plan.names[i] for s in (1, 3) for i in range(*plan.bounds[s])]
    assert all(key.split(".")[0] in names for key in local.state_dict())
    assert plan.stage_module(stack, 1)[0] is dict(stack.named_children())[names[0]]  # shared, not copied


def test_module_list_is_a_stack_too():
    plan = plan_stages(nn.ModuleList([nn.Linear(2, 2) for _ in range(4)]), 2, 2, "looped")
    assert plan.bounds == [(0, 2), (2, 4)]


def test_not_a_stack_and_too_few_blocks_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"got Linear.*PipelineParallelStrategy\(module=\.\.\.\)"):
        plan_stages(nn.Linear(2, 2), 2, 2, "looped")
    with pytest.raises(ValueError, match="3 blocks, fewer than the 4 stages"):
        plan_stages(nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)]), 4, 2, "looped")
