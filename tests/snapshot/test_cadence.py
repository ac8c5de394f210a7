"""Steps between memory snapshots, from what a snapshot and a step cost."""

from __future__ import annotations

import math

import pytest

from lightning_scale.snapshot.cadence import SnapshotCadence


def test_a_cheap_snapshot_is_taken_every_step_and_a_costly_one_as_often_as_the_overhead_allows():
    cadence = SnapshotCadence(None, max_overhead=0.02)
    cadence.record_step(0.5)
    cadence.record_snapshot(0.005)
    assert cadence.steps() == 1
    cadence.record_snapshot(0.1)  # 10 s of steps per 0.1 s snapshot keeps it at 1 %... of 2 %: 10 steps
    assert cadence.steps() == 10
    assert cadence.snapshot_seconds / (cadence.steps() * cadence.step_seconds) <= 0.02


def test_a_known_failure_rate_stretches_the_interval_to_young_daly():
    cadence = SnapshotCadence(None, max_overhead=0.02, mtbf_seconds=3600.0)
    cadence.record_step(0.5)
    cadence.record_snapshot(0.1)
    assert cadence.steps() == math.ceil(math.sqrt(2 * 0.1 * 3600.0) / 0.5)


def test_a_fixed_cadence_and_bad_arguments():
    assert SnapshotCadence(7, max_overhead=0.01).steps() == 7
    for kwargs, message in [
        ({"every_n_steps": 0, "max_overhead": 0.01}, "every_n_steps=0"),
        ({"every_n_steps": None, "max_overhead": 1.5}, "max_overhead=1.5"),
        ({"every_n_steps": None, "max_overhead": 0.01, "mtbf_seconds": 0}, "mtbf_seconds=0"),
    ]:
        with pytest.raises(ValueError, match=message):
            SnapshotCadence(**kwargs)


def test_what_steps_beside_a_copy_to_another_node_lose_counts_once_a_step_without_one_is_measured():
    cadence = SnapshotCadence(None, max_overhead=0.01)
    cadence.record_snapshot(0.02)
    cadence.record_step(0.2, copying=True)  # snapshots every step: every step has a copy beside it
    cadence.record_copy(1)
    assert cadence.cost_seconds() == 0.02 and cadence.steps() == 10  # from the wait alone, until a quiet step
    cadence.record_step(0.1)
    assert cadence.cost_seconds() == pytest.approx(0.12) and cadence.steps() == 120
    cadence.record_step(0.1, copying=True)  # the copy's steps got faster: a running mean
    assert cadence.copying_step_seconds == pytest.approx(0.18)
    cadence.record_step(0.05, copying=True)
    cadence.record_copy(3)
    assert cadence.cost_seconds() == pytest.approx(0.02 + (0.154 - 0.1) * 3)
    cadence.record_step(0.3)  # quiet steps now slower than those beside the copy: nothing is lost to it
    cadence.record_step(0.3)
    assert cadence.step_seconds == pytest.approx(0.172) and cadence.cost_seconds() == pytest.approx(0.02)
