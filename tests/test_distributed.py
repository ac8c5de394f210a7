"""lightning_scale.distributed: no-ops alone, a clear error when a process group is missing."""

from __future__ import annotations

import gc

import pytest
import torch

from lightning_scale import distributed
from tests.jobs import run_json_job


def test_single_process_votes_and_gathers_are_local():
    assert distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.any_rank(True) and not distributed.any_rank(False)
    assert distributed.all_ranks(True) and not distributed.all_ranks(False)
    assert distributed.all_gather_object({"a": 1}) == [{"a": 1}]
    assert distributed.broadcast_object("x") == "x"
    assert distributed.send_to_others(torch.ones(1)) == []
    assert distributed.start_receive(torch.ones(1), src=0) == []
    distributed.barrier()


def test_missing_process_group_in_a_multi_process_job_is_an_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(distributed.DistributedNotInitializedError, match=r"WORLD_SIZE=2 .*no process group"):
        distributed.any_rank(True)


def test_a_process_that_ends_freezes_its_heap_and_one_that_goes_on_does_not():
    imported = gc.get_freeze_count()  # what importing the package froze (tests/test_collector.py)
    distributed.destroy_process_group()
    assert gc.get_freeze_count() == imported  # called from Python, e.g. between two jobs: the collector stays as it was
    try:
        distributed.destroy_process_group(process_ends=True)
        assert gc.get_freeze_count() > imported  # the interpreter's final collection skips what is alive now
    finally:
        gc.unfreeze()


def test_importing_the_forkserver_setup_outside_a_forkserver_freezes_nothing():
    import importlib

    import lightning_scale.data._forkserver_setup as setup

    frozen = gc.get_freeze_count()
    importlib.reload(setup)
    assert gc.get_freeze_count() == frozen


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_reduce_scatter_and_all_gather_match_torchs_on_3_processes(tmp_path):
    """On gloo they run as a ring of sends and receives: 3 ranks take it round twice (2 ranks once)."""
    result = run_json_job("tests.ring_job", tmp_path, {}, devices=3)
    assert result["world"] == 3 and max(result["differences"]) < 1e-5
