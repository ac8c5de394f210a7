"""Unit tests of right-sizing: suggestions from peak memory and busy time, its metric keys, and CPU peak memory."""

from __future__ import annotations

import pytest
import torch

from lightning_scale.cost.rightsizing import GIB, RightSizingReport, measure_peak_memory


def _report(memory_fraction, busy_fraction, device_type="cuda"):
    capacity = 80 * GIB
    return RightSizingReport(device_type, int(memory_fraction * capacity), capacity, busy_fraction)


def test_a_well_sized_busy_machine_gets_no_suggestion():
    report = _report(memory_fraction=0.7, busy_fraction=0.95)
    assert report.suggestions() == []
    assert report.text().endswith("The machine fits the job.")


def test_an_oversized_machine_is_told_it_fits_a_smaller_instance():
    (advice,) = _report(memory_fraction=0.1, busy_fraction=0.95).suggestions()
    assert "accelerator memory is 10% of capacity" in advice and "smaller instance" in advice


def test_a_nearly_full_machine_is_told_how_to_make_room():
    (advice,) = _report(memory_fraction=0.95, busy_fraction=0.95).suggestions()
    assert "95% of capacity" in advice and "close to running out" in advice


def test_a_mostly_idle_machine_is_told_to_fix_the_input_pipeline_first():
    (advice,) = _report(memory_fraction=0.7, busy_fraction=0.3).suggestions()
    assert "30% of the wall time" in advice and "num_workers" in advice


def test_memory_and_busy_advice_add_up():
    report = _report(memory_fraction=0.1, busy_fraction=0.3, device_type="cpu")
    assert len(report.suggestions()) == 2
    assert "memory (resident, per process) is 10%" in report.suggestions()[0]
    assert report.text().startswith("Right-sizing: peak memory 8.00 of 80.00 GiB (10%), busy 30%.")


@pytest.mark.parametrize(("memory_fraction", "busy_fraction"), [(0.4, 0.6), (0.9, 0.6)])
def test_the_thresholds_themselves_are_well_sized(memory_fraction, busy_fraction):
    assert _report(memory_fraction, busy_fraction).suggestions() == []


def test_metrics_keys_and_values():
    report = RightSizingReport("cuda", peak_memory_bytes=20 * GIB, capacity_bytes=80 * GIB, busy_fraction=0.5)
    assert report.metrics() == {
        "rightsizing/peak_memory_gib": 20.0,
        "rightsizing/memory_capacity_gib": 80.0,
        "rightsizing/peak_memory_fraction": 0.25,
        "rightsizing/busy_fraction": 0.5,
    }
    assert list(report.metrics(prefix="rs/")) == [
        "rs/peak_memory_gib",
        "rs/memory_capacity_gib",
        "rs/peak_memory_fraction",
        "rs/busy_fraction",
    ]


def test_an_unknown_capacity_gives_a_zero_fraction_not_a_division_error():
    assert RightSizingReport("cpu", peak_memory_bytes=GIB, capacity_bytes=0, busy_fraction=1.0).memory_fraction == 0.0


def test_measure_peak_memory_on_cpu_is_a_positive_peak_below_capacity():
    peak, capacity = measure_peak_memory(torch.device("cpu"))
    assert 0 < peak < capacity
    assert peak > 10 * 1024**2  # a Python process with torch loaded holds well over 10 MiB: the unit is bytes


def test_processes_on_a_node_share_its_cpu_memory():
    _, alone = measure_peak_memory(torch.device("cpu"))
    _, shared = measure_peak_memory(torch.device("cpu"), processes_on_node=4)
    assert shared == alone // 4
