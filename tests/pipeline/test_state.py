"""Checkpoint state of a pipeline: stages' weights merged and split back, optimizer states per pipeline rank, and the
rank grid those follow."""

from __future__ import annotations

import pytest

from lightning_scale.parallel.pipeline import (
    PipelineGrid,
    gather_model_state,
    gather_optimizer_state,
    stage_model_state,
    stage_optimizer_states,
)


def test_one_process_gathers_its_own_state_and_takes_back_only_its_stage_keys():
    assert gather_model_state({"0.weight": 1}, group=None) == {"0.weight": 1}
    full = {"0.weight": 1, "1.weight": 2, "2.weight": 3}
    assert stage_model_state(full, {"1.weight": 0}, strict=True) == {"1.weight": 2}
    with pytest.raises(KeyError, match=r"lacks \['3.weight'\] of this pipeline stage"):
        stage_model_state(full, {"3.weight": 0}, strict=True)
    assert stage_model_state(full, {"3.weight": 0}, strict=False) == {}


def test_optimizer_states_resume_only_on_the_same_number_of_pipeline_ranks():
    saved = [{"pipeline_ranks": [{"rank": 0}, {"rank": 1}]}]
    assert stage_optimizer_states(saved, pipeline_size=2, pipeline_rank=1) == [{"rank": 1}]
    with pytest.raises(ValueError, match="come from 2 pipeline ranks, this run has 4; resume with the same"):
        stage_optimizer_states(saved, pipeline_size=4, pipeline_rank=0)
    assert gather_optimizer_state({"rank": 0}, group=None) == {"pipeline_ranks": [{"rank": 0}]}


def test_the_grid_is_row_major_and_refuses_a_pipeline_size_that_does_not_divide_the_world():
    grid = PipelineGrid(world_size=6, global_rank=4, pipeline_size=3)
    assert (grid.replicas, grid.replica, grid.pipeline_rank) == (2, 1, 1)
    with pytest.raises(ValueError, match=r"pipeline_size=4 does not divide the world size 6"):
        PipelineGrid(world_size=6, global_rank=0, pipeline_size=4)
