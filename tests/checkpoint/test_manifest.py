"""Unit tests of checkpoint manifests: publication, validation and the choice of the checkpoint to resume from."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import pytest

from lightning_scale.checkpoint.manifest import (
    MANIFEST_VERSION,
    Manifest,
    find_newest_valid,
    list_manifests,
    manifest_name,
    publish_checkpoint,
    read_manifest,
    validate,
)
from lightning_scale.checkpoint.store import CheckpointStore


@pytest.fixture
def store(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    store.check_writable()
    return store


def _publish(store, step, data=None, name=None):
    """Publish a checkpoint for ``step`` the way ResumableCheckpoint does: temporary file first, then the manifest."""
    name = name or f"epoch=0-step={step}.ckpt"
    data = data if data is not None else f"weights at step {step}".encode() * 50
    temporary = f".{name}.partial"
    store.write_bytes(temporary, data)
    return publish_checkpoint(
        store,
        temporary,
        name,
        global_step=step,
        epoch=0,
        run_id="run-a",
        world_size=1,
        tensor_shapes={"layer.weight": [4, 2]},
    )


def _set_mtime(store, name, unix):
    os.utime(store.path(name), (unix, unix))


def test_publish_checkpoint_publishes_the_file_and_a_manifest_with_its_size_and_sha256(store):
    data = b"0123456789" * 100
    manifest = _publish(store, 10, data)
    assert store.names() == ["epoch=0-step=10.ckpt", "epoch=0-step=10.ckpt.manifest.json"]
    assert store.read_bytes("epoch=0-step=10.ckpt") == data
    on_disk = json.loads(store.read_bytes("epoch=0-step=10.ckpt.manifest.json"))
    assert on_disk["name"] == "epoch=0-step=10.ckpt"
    assert on_disk["size"] == len(data)
    assert on_disk["sha256"] == hashlib.sha256(data).hexdigest()
    assert on_disk["global_step"] == 10
    assert on_disk["version"] == MANIFEST_VERSION
    assert on_disk["tensor_shapes"] == {"layer.weight": [4, 2]}
    assert read_manifest(store, "epoch=0-step=10.ckpt") == manifest


def test_manifest_json_round_trips(store):
    manifest = _publish(store, 3)
    assert Manifest.from_json(manifest.to_json()) == manifest


@pytest.mark.parametrize("version", [MANIFEST_VERSION + 1, 0, None, "1"])
def test_manifest_with_another_version_is_refused(store, version):
    raw = json.loads(_publish(store, 3).to_json())
    raw["version"] = version
    with pytest.raises(ValueError, match="manifest version"):
        Manifest.from_json(json.dumps(raw).encode())


def test_manifest_without_a_version_is_refused(store):
    raw = json.loads(_publish(store, 3).to_json())
    del raw["version"]
    with pytest.raises(ValueError, match="manifest version None"):
        Manifest.from_json(json.dumps(raw).encode())


def test_validate_accepts_an_intact_checkpoint(store):
    assert validate(store, _publish(store, 10)) is None


def test_validate_reports_a_truncated_checkpoint(store):
    manifest = _publish(store, 10)
    data = store.read_bytes(manifest.name)
    store.write_bytes(manifest.name, data[: len(data) // 2])
    reason = validate(store, manifest)
    assert reason is not None
    assert "truncated" in reason
    assert str(len(data) // 2) in reason and str(len(data)) in reason


def test_validate_reports_a_corrupted_checkpoint_of_the_same_size(store):
    manifest = _publish(store, 10)
    data = bytearray(store.read_bytes(manifest.name))
    data[len(data) // 2] ^= 0x01
    store.write_bytes(manifest.name, bytes(data))
    assert store.size(manifest.name) == manifest.size
    reason = validate(store, manifest)
    assert reason is not None
    assert "sha256" in reason and "corrupted" in reason


def test_validate_reports_a_missing_checkpoint(store):
    manifest = _publish(store, 10)
    store.remove(manifest.name)
    reason = validate(store, manifest)
    assert reason is not None
    assert "missing" in reason


def test_republishing_a_name_replaces_its_manifest(store):
    _publish(store, 10, b"first version")
    second = _publish(store, 10, b"the second version")
    assert read_manifest(store, second.name) == second
    assert second.sha256 == hashlib.sha256(b"the second version").hexdigest()
    assert validate(store, second) is None
    assert store.names() == [second.name, manifest_name(second.name)]


class Crash(Exception):
    """Stands for the process dying at this point."""


@pytest.mark.parametrize("crash_at", range(8))
def test_republishing_a_name_never_leaves_it_without_a_valid_copy(store, monkeypatch, crash_at):
    _publish(store, 5)
    _publish(store, 10, b"first version", name="last.ckpt")
    store.write_bytes(".last.ckpt.partial", b"second version")
    operations = []

    def crashing(method):
        original = getattr(store, method)

        def call(*args):
            operations.append(method)
            if len(operations) > crash_at:
                raise Crash
            return original(*args)

        return call

    for method in ("write_bytes", "publish", "remove"):
        monkeypatch.setattr(store, method, crashing(method))
    finished = True
    try:
        publish_checkpoint(
            store, ".last.ckpt.partial", "last.ckpt", global_step=20, epoch=0, run_id="run-a", world_size=1,
            tensor_shapes={},
        )  # fmt: skip
    except Crash:
        finished = False
    monkeypatch.undo()
    chosen, _ = find_newest_valid(store)
    assert chosen is not None and chosen.global_step in (10, 20)
    assert store.read_bytes(chosen.name) == (b"second version" if chosen.global_step == 20 else b"first version")
    if finished:
        assert chosen.global_step == 20 and not [n for n in store.names() if ".previous" in n]


def test_find_newest_valid_picks_the_highest_global_step(store):
    for step in [10, 30, 20]:
        _publish(store, step)
    chosen, skipped = find_newest_valid(store)
    assert chosen is not None
    assert chosen.global_step == 30
    assert chosen.name == "epoch=0-step=30.ckpt"
    assert skipped == []


def test_find_newest_valid_ranks_by_global_step_not_by_name(store):
    _publish(store, 9)
    _publish(store, 10)
    chosen, _ = find_newest_valid(store)
    assert chosen is not None and chosen.global_step == 10


def test_find_newest_valid_skips_a_truncated_newest_checkpoint_and_names_it(store):
    _publish(store, 10)
    newest = _publish(store, 20)
    store.write_bytes(newest.name, store.read_bytes(newest.name)[:-1])
    chosen, skipped = find_newest_valid(store)
    assert chosen is not None and chosen.global_step == 10
    assert len(skipped) == 1
    assert store.url(newest.name) in skipped[0]
    assert "truncated" in skipped[0]


def test_find_newest_valid_skips_every_bad_checkpoint_newer_than_the_chosen_one(store):
    _publish(store, 10)
    corrupted = _publish(store, 20)
    missing = _publish(store, 30)
    data = bytearray(store.read_bytes(corrupted.name))
    data[0] ^= 0xFF
    store.write_bytes(corrupted.name, bytes(data))
    store.remove(missing.name)
    chosen, skipped = find_newest_valid(store)
    assert chosen is not None and chosen.global_step == 10
    assert len(skipped) == 2
    assert missing.name in skipped[0] and "missing" in skipped[0]
    assert corrupted.name in skipped[1] and "sha256" in skipped[1]


def test_find_newest_valid_of_an_empty_or_missing_directory_is_none(store, tmp_path):
    assert find_newest_valid(store) == (None, [])
    assert find_newest_valid(CheckpointStore(str(tmp_path / "missing"))) == (None, [])


def test_find_newest_valid_returns_none_when_no_checkpoint_is_intact(store):
    only = _publish(store, 10)
    store.write_bytes(only.name, b"")
    chosen, skipped = find_newest_valid(store)
    assert chosen is None
    assert len(skipped) == 1 and only.name in skipped[0]


def test_find_newest_valid_reports_a_newer_checkpoint_without_manifest(store):
    chosen_manifest = _publish(store, 10)
    store.write_bytes("epoch=0-step=20.ckpt", b"a save that crashed before its manifest")
    _set_mtime(store, "epoch=0-step=20.ckpt", chosen_manifest.created_unix + 60)
    chosen, skipped = find_newest_valid(store)
    assert chosen == chosen_manifest
    assert skipped == [f"{store.url('epoch=0-step=20.ckpt')}: no valid manifest (the save did not finish)"]


def test_find_newest_valid_does_not_report_an_older_checkpoint_without_manifest(store):
    store.write_bytes("epoch=0-step=5.ckpt", b"an old save that crashed before its manifest")
    _set_mtime(store, "epoch=0-step=5.ckpt", time.time() - 3600)
    _publish(store, 10)
    chosen, skipped = find_newest_valid(store)
    assert chosen is not None and chosen.global_step == 10
    assert skipped == []


def test_find_newest_valid_reports_a_checkpoint_without_manifest_when_nothing_is_valid(store):
    store.write_bytes("epoch=0-step=5.ckpt", b"partial")
    chosen, skipped = find_newest_valid(store)
    assert chosen is None
    assert len(skipped) == 1 and "epoch=0-step=5.ckpt" in skipped[0]


def test_find_newest_valid_reports_and_ignores_a_garbage_manifest(store):
    chosen_manifest = _publish(store, 10)
    store.write_bytes("epoch=0-step=20.ckpt", b"weights at step 20")
    store.write_bytes("epoch=0-step=20.ckpt.manifest.json", b"{ this is not json")
    _set_mtime(store, "epoch=0-step=20.ckpt", chosen_manifest.created_unix + 60)
    chosen, skipped = find_newest_valid(store)
    assert chosen == chosen_manifest
    assert len(skipped) == 1
    assert store.url("epoch=0-step=20.ckpt") in skipped[0]
    assert "no valid manifest" in skipped[0]


def test_find_newest_valid_reports_and_ignores_a_manifest_of_another_version(store):
    chosen_manifest = _publish(store, 10)
    newer = _publish(store, 20)
    store.write_bytes(manifest_name(newer.name), dataclasses.replace(newer, version=MANIFEST_VERSION + 1).to_json())
    _set_mtime(store, newer.name, chosen_manifest.created_unix + 60)
    chosen, skipped = find_newest_valid(store)
    assert chosen == chosen_manifest
    assert len(skipped) == 1 and newer.name in skipped[0]


def test_list_manifests_sorts_newest_first_and_lists_files_without_usable_manifest(store):
    for step in [10, 30, 20]:
        _publish(store, step)
    store.write_bytes("epoch=0-step=40.ckpt", b"orphan")
    store.write_bytes("epoch=0-step=50.ckpt.manifest.json", b"garbage")
    manifests, orphans = list_manifests(store)
    assert [m.global_step for m in manifests] == [30, 20, 10]
    assert sorted(orphans) == ["epoch=0-step=40.ckpt", "epoch=0-step=50.ckpt"]


@pytest.mark.parametrize("garbage", [b"[]", b"null", b"42"])
def test_find_newest_valid_reports_a_manifest_holding_json_that_is_not_an_object(store, garbage):
    chosen_manifest = _publish(store, 10)
    store.write_bytes("epoch=0-step=20.ckpt", b"weights at step 20")
    store.write_bytes("epoch=0-step=20.ckpt.manifest.json", garbage)
    _set_mtime(store, "epoch=0-step=20.ckpt", chosen_manifest.created_unix + 60)
    chosen, skipped = find_newest_valid(store)
    assert chosen == chosen_manifest
    assert len(skipped) == 1 and "epoch=0-step=20.ckpt" in skipped[0]
