"""The schedule spec: what each of torch's schedules needs, checked by name before anything runs."""

from __future__ import annotations

import pytest

from lightning_scale.parallel.pipeline import SCHEDULES, schedule_spec


def test_every_spec_is_registered_under_its_own_name_and_its_default_fits():
    for name, spec in SCHEDULES.items():
        assert spec.name == name
        assert spec.stages_per_rank(None) == spec.default_stages_per_rank


@pytest.mark.parametrize(
    ("name", "stages", "message"),
    [
        ("1f1b", 2, r"stages_per_rank=2 does not fit schedule='1f1b': gpipe and 1f1b run one stage per rank"),
        ("interleaved_1f1b", 0, r"stages_per_rank=0 does not fit schedule='interleaved_1f1b'"),
        ("zbv_zero_bubble", 3, r"zbv_zero_bubble runs exactly 2 stages per rank \(got stages_per_rank=3\)"),
    ],
)
def test_stages_per_rank_that_a_schedule_cannot_run_are_refused(name, stages, message):
    with pytest.raises(ValueError, match=message):
        schedule_spec(name).stages_per_rank(stages)


def test_an_unknown_schedule_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"schedule='2f2b' is not one of \['1f1b', 'gpipe'"):
        schedule_spec("2f2b")
