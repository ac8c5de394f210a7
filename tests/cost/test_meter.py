"""Unit tests of the cost meter, driven by a fake clock: billing, restarts, busy time, rates and projections."""

from __future__ import annotations

import pytest

from lightning_scale.cost.meter import CostMeter, CostReport


class FakeClock:
    """Wall-clock seconds that move only when a test advances them."""

    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


def _step(meter, clock, step, busy_seconds, idle_seconds=0.0, samples=0):
    """One training step: ``idle_seconds`` outside the step (data wait), then ``busy_seconds`` inside it."""
    clock.advance(idle_seconds)
    meter.step_started()
    clock.advance(busy_seconds)
    meter.step_ended(step=step, samples=samples)


def test_a_fresh_start_bills_no_gap_and_nothing_yet(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    assert not meter.running
    assert meter.start() == 0.0
    assert meter.running
    report = meter.report(step=0, total_steps=None)
    assert (report.usd_total, report.hours, report.preemption_waste_usd) == (0.0, 0.0, 0.0)
    assert meter.last_gap_seconds is None


def test_usd_total_is_price_times_hours_exactly(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    for step in range(1, 5):
        clock.advance(450.0)  # 1/8 hour: 1 USD at 8 USD/h
        report = meter.report(step=step, total_steps=None)
        assert report.usd_total == float(step)
        assert report.hours == step / 8
        assert report.usd_per_hour == 8.0


def test_the_meter_bills_nothing_before_start(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    clock.advance(3600.0)
    assert meter.report(step=0, total_steps=None).usd_total == 0.0


def test_a_resumed_meter_bills_the_restart_gap_as_waste_and_continues_the_totals(clock):
    first = CostMeter(usd_per_hour=8.0, clock=clock)
    first.start()
    _step(first, clock, step=1, busy_seconds=450.0, samples=64)
    state = first.state_dict()
    assert state["seconds"] == 450.0 and state["saved_at"] == clock.now

    clock.advance(900.0)  # preempted: the work since the checkpoint plus the restart
    second = CostMeter(usd_per_hour=8.0, clock=clock)
    second.load_state_dict(state)
    assert second.start() == 900.0
    assert second.last_gap_seconds == 900.0
    clock.advance(450.0)
    report = second.report(step=2, total_steps=None)
    assert report.usd_total == 4.0  # 450 s before + 900 s gap + 450 s after, at 8 USD/h
    assert report.preemption_waste_usd == 2.0
    assert report.usd_per_1k_samples == 4.0 * 1000 / 64  # samples continue from the saved state


def test_an_attempt_on_fewer_nodes_keeps_what_the_earlier_one_cost_and_bills_its_own_rate(clock):
    two_nodes = CostMeter(usd_per_hour=16.0, on_demand_usd_per_hour=40.0, clock=clock)
    two_nodes.start()
    clock.advance(900.0)  # 4 USD at 16 USD/h
    state = two_nodes.state_dict()
    clock.advance(450.0)  # the restart gap, billed at the nodes that waited for it: 1 USD at 8 USD/h
    one_node = CostMeter(usd_per_hour=8.0, on_demand_usd_per_hour=20.0, clock=clock)
    one_node.load_state_dict(state)
    one_node.start()
    clock.advance(900.0)  # 2 USD at 8 USD/h
    report = one_node.report(step=2, total_steps=None)
    assert (report.usd_total, report.preemption_waste_usd, report.usd_per_hour) == (7.0, 1.0, 8.0)
    assert report.savings_vs_on_demand_usd == 10.0 + 5.0 - 7.0  # on-demand price of each attempt's useful time
    assert report.hours == 2250.0 / 3600.0


def test_a_state_of_an_earlier_release_is_billed_at_the_new_rate(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.load_state_dict(
        {"seconds": 450.0, "busy_seconds": 0.0, "waste_seconds": 0.0, "samples": 0, "saved_at": clock.now}
    )
    meter.start()
    assert meter.report(step=1, total_steps=None).usd_total == 1.0


def test_a_restart_gap_above_the_cap_is_billed_at_the_cap(clock):
    first = CostMeter(usd_per_hour=8.0, clock=clock)
    first.start()
    clock.advance(450.0)
    state = first.state_dict()

    clock.advance(86_400.0)  # resumed by hand the next day
    second = CostMeter(usd_per_hour=8.0, clock=clock, max_restart_gap_seconds=900.0)
    second.load_state_dict(state)
    assert second.start() == 900.0
    assert second.last_gap_seconds == 86_400.0
    report = second.report(step=1, total_steps=None)
    assert report.usd_total == 3.0 and report.preemption_waste_usd == 2.0


def test_a_saved_at_in_the_future_bills_no_negative_gap(clock):
    first = CostMeter(usd_per_hour=8.0, clock=clock)
    first.start()
    clock.advance(450.0)
    state = first.state_dict()
    clock.advance(-30.0)  # another machine whose clock is behind
    second = CostMeter(usd_per_hour=8.0, clock=clock)
    second.load_state_dict(state)
    assert second.start() == 0.0 and second.last_gap_seconds == 0.0
    assert second.report(step=1, total_steps=None).usd_total == 1.0


def test_idle_fraction_is_the_time_outside_training_steps(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    for step in range(1, 5):
        _step(meter, clock, step, busy_seconds=3.0, idle_seconds=1.0)
    assert meter.report(step=4, total_steps=None).idle_fraction == 0.25


def test_per_sample_and_per_step_rates(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    assert meter.report(step=0, total_steps=None).usd_per_step is None
    assert meter.report(step=0, total_steps=None).usd_per_1k_samples is None
    _step(meter, clock, step=1, busy_seconds=450.0, samples=250)
    _step(meter, clock, step=2, busy_seconds=450.0, samples=250)
    report = meter.report(step=2, total_steps=None)
    assert report.usd_total == 2.0
    assert report.usd_per_step == 1.0
    assert report.usd_per_1k_samples == 4.0


def test_the_projection_follows_the_recent_rate_not_a_slow_start(clock):
    meter = CostMeter(usd_per_hour=3600.0, clock=clock, rate_window_steps=4)  # 1 USD per second
    meter.start()
    for step in range(1, 5):
        _step(meter, clock, step, busy_seconds=10.0)  # warm-up: 10 s per step
    for step in range(5, 11):
        _step(meter, clock, step, busy_seconds=1.0)  # then 1 s per step
    report = meter.report(step=10, total_steps=100)
    assert report.usd_total == 46.0
    assert report.projected_usd == 46.0 + 90 * 1.0  # the average (4.6 USD/step) would give 460


def test_the_projection_is_none_without_total_steps_or_before_the_first_step(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    assert meter.report(step=0, total_steps=100).projected_usd is None
    _step(meter, clock, step=1, busy_seconds=450.0)
    assert meter.report(step=1, total_steps=None).projected_usd is None
    assert "cost/projected_usd" not in meter.report(step=1, total_steps=None).metrics()


def test_the_projection_after_a_restart_uses_the_average_until_two_steps_are_seen(clock):
    first = CostMeter(usd_per_hour=8.0, clock=clock)
    first.start()
    _step(first, clock, step=1, busy_seconds=450.0)
    state = first.state_dict()
    second = CostMeter(usd_per_hour=8.0, clock=clock)
    second.load_state_dict(state)
    second.start()
    report = second.report(step=1, total_steps=4)
    assert report.projected_usd == 1.0 + 3 * 1.0
    _step(second, clock, step=2, busy_seconds=450.0)
    _step(second, clock, step=3, busy_seconds=900.0)  # the recent rate is now 2 USD/step
    assert second.report(step=3, total_steps=4).projected_usd == 4.0 + 1 * 2.0


def test_the_projection_past_total_steps_is_the_total_so_far(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    _step(meter, clock, step=1, busy_seconds=450.0)
    _step(meter, clock, step=2, busy_seconds=450.0)
    assert meter.report(step=2, total_steps=1).projected_usd == 2.0


def test_savings_are_on_demand_price_of_the_useful_time_minus_the_bill(clock):
    first = CostMeter(usd_per_hour=8.0, on_demand_usd_per_hour=24.0, clock=clock)
    first.start()
    clock.advance(900.0)
    state = first.state_dict()
    clock.advance(450.0)  # restart gap: waste, which on-demand capacity would not have had
    second = CostMeter(usd_per_hour=8.0, on_demand_usd_per_hour=24.0, clock=clock)
    second.load_state_dict(state)
    second.start()
    clock.advance(900.0)
    report = second.report(step=1, total_steps=None)
    assert report.usd_total == 5.0  # 2250 s at 8 USD/h
    assert report.savings_vs_on_demand_usd == 7.0  # 24 USD/h x (2250 s - 450 s of waste) - 5 USD


def test_savings_are_unknown_without_an_on_demand_price(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    clock.advance(450.0)
    report = meter.report(step=1, total_steps=None)
    assert report.savings_vs_on_demand_usd is None
    assert "cost/savings_vs_on_demand_usd" not in report.metrics()


def test_stop_then_start_does_not_bill_the_time_in_between(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    clock.advance(450.0)
    meter.stop()
    assert not meter.running
    clock.advance(10_000.0)
    assert meter.report(step=1, total_steps=None).usd_total == 1.0
    assert meter.start() == 0.0
    clock.advance(450.0)
    report = meter.report(step=2, total_steps=None)
    assert report.usd_total == 2.0 and report.preemption_waste_usd == 0.0


def test_stop_twice_and_start_twice_are_harmless(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    clock.advance(450.0)
    meter.start()
    clock.advance(450.0)
    meter.stop()
    meter.stop()
    assert meter.seconds() == 900.0


def test_a_step_open_at_stop_is_not_counted_as_busy(clock):
    meter = CostMeter(usd_per_hour=8.0, clock=clock)
    meter.start()
    meter.step_started()
    clock.advance(100.0)
    meter.stop()
    meter.start()
    meter.step_ended(step=1, samples=1)
    assert meter.report(step=1, total_steps=None).idle_fraction == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"usd_per_hour": -1.0},
        {"usd_per_hour": 1.0, "on_demand_usd_per_hour": -0.5},
        {"usd_per_hour": 1.0, "max_restart_gap_seconds": -1.0},
    ],
)
def test_negative_arguments_raise(kwargs):
    with pytest.raises(ValueError, match=">= 0"):
        CostMeter(**kwargs)


def test_a_nan_price_raises():
    with pytest.raises(ValueError, match=">= 0"):
        CostMeter(usd_per_hour=float("nan"))


def test_a_zero_price_bills_nothing(clock):
    meter = CostMeter(usd_per_hour=0.0, clock=clock)
    meter.start()
    clock.advance(3600.0)
    assert meter.report(step=1, total_steps=None).usd_total == 0.0


def test_report_metrics_are_prefixed_and_omit_unknown_figures():
    report = CostReport(
        usd_total=2.0,
        usd_per_hour=8.0,
        usd_per_step=None,
        usd_per_1k_samples=0.5,
        projected_usd=None,
        preemption_waste_usd=0.0,
        savings_vs_on_demand_usd=None,
        idle_fraction=0.25,
        hours=0.25,
    )
    assert report.metrics() == {
        "cost/usd_total": 2.0,
        "cost/usd_per_hour": 8.0,
        "cost/usd_per_1k_samples": 0.5,
        "cost/preemption_waste_usd": 0.0,
        "cost/idle_fraction": 0.25,
        "cost/hours": 0.25,
    }
    assert set(report.metrics(prefix="x/")) == {key.replace("cost/", "x/") for key in report.metrics()}


def test_a_state_saved_before_start_still_owes_the_gap_since_the_loaded_one():
    clock = FakeClock()
    first = CostMeter(usd_per_hour=8.0, clock=clock)
    first.start()
    clock.advance(450.0)
    saved = first.state_dict()
    loaded = CostMeter(usd_per_hour=8.0, clock=clock)
    loaded.load_state_dict(saved)
    clock.advance(900.0)
    again = loaded.state_dict()  # e.g. a checkpoint written before training restarted
    assert again == saved
    resumed = CostMeter(usd_per_hour=8.0, clock=clock)
    resumed.load_state_dict(again)
    clock.advance(900.0)
    assert resumed.start() == 1800.0  # both gaps, counted once
