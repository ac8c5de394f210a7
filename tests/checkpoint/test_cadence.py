"""The Young/Daly checkpoint interval from a measured save cost and the mean time between interruptions."""

from __future__ import annotations

import math

import pytest

from lightning_scale.checkpoint import AutoCadence, young_daly_interval_seconds


@pytest.mark.parametrize(("save_s", "mtbi_h"), [(0.5, 1.0), (4.0, 6.0), (30.0, 24.0)])
def test_the_chosen_interval_is_sqrt_2_c_m_within_5_percent(save_s, mtbi_h):
    cadence = AutoCadence(mtbi_seconds=mtbi_h * 3600)
    for _ in range(3):
        cadence.record(save_s)
    assert cadence.interval_seconds() == pytest.approx(math.sqrt(2 * save_s * mtbi_h * 3600), rel=0.05)


def test_the_interval_follows_the_median_of_recent_saves_not_one_outlier():
    cadence = AutoCadence(mtbi_seconds=3600, initial_save_seconds=8.0, window=3)
    assert cadence.save_seconds == 8.0  # assumed until a save is measured
    for cost in (2.0, 2.0, 50.0):
        cadence.record(cost)
    assert cadence.save_seconds == 2.0
    for cost in (50.0, 50.0):  # saves really became slower: the interval grows
        cadence.record(cost)
    assert cadence.interval_seconds() == young_daly_interval_seconds(50.0, 3600)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"must be > 0"):
        AutoCadence(mtbi_seconds=0)
    with pytest.raises(ValueError, match=r"window=0"):
        AutoCadence(mtbi_seconds=1, window=0)
    with pytest.raises(ValueError, match=r"save_seconds=-1"):
        young_daly_interval_seconds(-1, 10)
