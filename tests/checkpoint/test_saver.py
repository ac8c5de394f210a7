"""The savers without a Trainer: what each mode publishes, when it is durable, what it reports, in one process."""

from __future__ import annotations

import threading

import pytest
import torch

from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.checkpoint.background import WriteResult
from lightning_scale.checkpoint.manifest import read_manifest
from lightning_scale.checkpoint.saver import BackgroundSaver, SaveHooks, SaveRequest, make_saver
from lightning_scale.checkpoint.writer import CheckpointWriter


class Reports:
    """Collects what a saver reports, and how often it built a state."""

    def __init__(self) -> None:
        self.durable: list[float] = []
        self.landed: list[WriteResult] = []
        self.warnings: list[str] = []
        self.states = 0

    def hooks(self) -> SaveHooks:
        return SaveHooks(durable=self.durable.append, landed=self.landed.extend, warn=self.warnings.append)

    def request(self, step: int, gate: threading.Event | None = None) -> SaveRequest:
        def state() -> dict:
            self.states += 1
            checkpoint = {"state_dict": {"w": torch.full((4,), float(step))}, "global_step": step}
            if gate is not None:  # the write, on the writer thread, waits for the gate
                checkpoint["gated"] = Gated(gate)
            return checkpoint

        def fields(checkpoint: dict) -> dict:
            return dict(global_step=step, epoch=0, run_id="r", generation=0, world_size=1, tensor_shapes={})

        return SaveRequest(name=f"step={step}.ckpt", step=step, state=state, fields=fields)


class Gated:
    """Copies to host memory at once, pickles only once its gate is open: holds a background write back."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        assert self.gate.wait(timeout=30)
        return (int, (0,))


class Unwritable:
    """Copies to host memory, fails when written, as a full disk would."""

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise OSError(28, "No space left on device")


def saver(tmp_path, reports: Reports, sharded: bool = False, background: bool = False):
    files = CheckpointWriter(CheckpointStore(str(tmp_path)), cache=None, retain=lambda: None)
    return make_saver(files, reports.hooks(), sharded=sharded, native=False, background=background)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_direct_save_is_durable_when_it_returns(tmp_path, sharded):
    reports = Reports()
    assert saver(tmp_path, reports, sharded=sharded).save(reports.request(2), synchronous=False)
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path)))
    assert manifest is not None and manifest.name == "step=2.ckpt" and (manifest.files is not None) == sharded
    assert len(reports.durable) == 1 and reports.landed == []


@pytest.mark.parametrize("sharded", [False, True])
def test_a_background_save_returns_before_it_is_written_and_lands_once_collected(tmp_path, sharded):
    reports, gate = Reports(), threading.Event()
    background = saver(tmp_path, reports, sharded=sharded, background=True)
    assert isinstance(background, BackgroundSaver) and background.sharded == sharded
    assert not background.save(reports.request(2, gate), synchronous=False)
    assert background.busy and find_newest_valid(CheckpointStore(str(tmp_path)))[0] is None  # not published yet
    gate.set()
    background.finish()
    assert [(r.what, r.error) for r in reports.landed] == [("step=2.ckpt", None)] and len(reports.durable) == 1
    assert read_manifest(CheckpointStore(str(tmp_path)), "step=2.ckpt").global_step == 2
    background.close()


def test_a_second_save_of_the_same_step_reuses_the_staged_state(tmp_path):
    reports = Reports()
    background = saver(tmp_path, reports, background=True)
    background.save(reports.request(4), synchronous=False)
    background.save(SaveRequest("last.ckpt", 4, reports.request(4).state, reports.request(4).fields), False)
    background.forget_staged()
    background.close()
    assert reports.states == 1  # a top-k file and last.ckpt of one step: staged once
    store = CheckpointStore(str(tmp_path))
    assert store.sha256("last.ckpt") == store.sha256("step=4.ckpt")


def test_a_synchronous_save_waits_for_the_one_in_flight_then_writes_directly(tmp_path):
    reports, gate = Reports(), threading.Event()
    background = saver(tmp_path, reports, background=True)
    background.save(reports.request(2, gate), synchronous=False)
    threading.Timer(0.2, gate.set).start()
    assert background.save(reports.request(3), synchronous=True)  # durable on return
    assert [r.what for r in reports.landed] == ["step=2.ckpt"]  # the save in flight landed first
    manifest, _ = find_newest_valid(CheckpointStore(str(tmp_path)))
    assert manifest is not None and manifest.global_step == 3
    background.close()


def test_a_failed_background_write_is_reported_and_never_published(tmp_path):
    reports = Reports()
    background = saver(tmp_path, reports, background=True)
    request = reports.request(2)
    broken = SaveRequest(request.name, 2, lambda: {"state": Unwritable()}, request.fields)
    background.save(broken, synchronous=False)
    background.finish()
    assert len(reports.landed) == 1 and reports.landed[0].error is not None
    assert len(reports.warnings) == 1 and "was not published" in reports.warnings[0]
    assert find_newest_valid(CheckpointStore(str(tmp_path)))[0] is None and reports.durable == []
    background.close()
