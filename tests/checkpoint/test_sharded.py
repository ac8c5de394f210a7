"""ResumableCheckpoint(sharded=True) in one process: the directory layout, its manifest, exact auto-resume,
corruption detected per file, and consolidation into one file."""

from __future__ import annotations

import random

import pytest
import torch

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks import ResumableCheckpoint
from lightning_scale.checkpoint import CheckpointStore, consolidate_checkpoint, find_newest_valid
from lightning_scale.checkpoint.manifest import manifest_name, read_manifest
from lightning_scale.testing import assert_same_tensors
from tests import fitting
from tests.fitting import FirstStep


def fit(dirpath, trainer_kwargs, max_steps, **checkpoint_kwargs):
    checkpoint = ResumableCheckpoint(dirpath=str(dirpath), every_n_train_steps=5, sharded=True, **checkpoint_kwargs)
    data = CharDataModule(batch_size=8, augment=True)
    trainer = fitting.fit(
        [checkpoint], trainer_kwargs, max_steps, model=lambda: CharTransformer(vocab_size=64), datamodule=data
    )
    return trainer, trainer.lightning_module


def test_a_sharded_checkpoint_is_a_directory_vouched_for_file_by_file(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=15, keep_last_k=2)
    store = CheckpointStore(str(tmp_path))
    assert [n for n in store.names() if n.endswith(".ckpt")] == ["epoch=0-step=10.ckpt", "epoch=0-step=15.ckpt"]
    manifest = read_manifest(store, "epoch=0-step=15.ckpt")
    assert manifest.files is not None and {".metadata", "meta.pt", "__0_0.distcp", "rank_0.pt"} <= set(manifest.files)
    on_disk = {p.name: p.stat().st_size for p in (tmp_path / "epoch=0-step=15.ckpt").iterdir()}
    assert {name: size for name, (size, _) in manifest.files.items()} == on_disk
    assert manifest.size == sum(on_disk.values())


def test_sharded_auto_resume_is_bitwise_exact(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=10)
    resumed_trainer, resumed = fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=20)
    _, reference = fit(tmp_path / "reference", tiny_trainer_kwargs, max_steps=20)
    assert resumed_trainer.global_step == 20
    for name, tensor in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[:100] + bytes([data[100] ^ 0xFF]) + data[101:], "does not match the manifest's sha256"),
        (lambda data: data[: len(data) // 2], "has "),
        (None, "is missing"),
    ],
    ids=["corrupted", "truncated", "missing"],
)
def test_a_damaged_shard_is_named_and_the_older_checkpoint_resumed(tmp_path, tiny_trainer_kwargs, damage, reason):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=10, keep_last_k=None)
    shard = tmp_path / "epoch=0-step=10.ckpt" / "__0_0.distcp"
    if damage is None:
        shard.unlink()
    else:
        shard.write_bytes(damage(shard.read_bytes()))
    newest, skipped = find_newest_valid(CheckpointStore(str(tmp_path)))
    assert newest is not None and newest.name == "epoch=0-step=5.ckpt"
    assert len(skipped) == 1 and f"__0_0.distcp {reason}" in skipped[0]
    first = FirstStep()
    with pytest.warns(UserWarning, match=r"__0_0\.distcp"):
        fitting.fit([ResumableCheckpoint(dirpath=str(tmp_path), every_n_train_steps=5, sharded=True), first],
                    tiny_trainer_kwargs, 12)  # fmt: skip
    assert first.first_step == 5


def test_consolidate_turns_a_sharded_checkpoint_into_one_file_that_loads_strictly(tmp_path, tiny_trainer_kwargs):
    _, model = fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=5)
    checkpoint = consolidate_checkpoint(tmp_path / "run" / "epoch=0-step=5.ckpt", tmp_path / "one.ckpt")
    fresh = CharTransformer(vocab_size=64)
    fresh.load_state_dict(torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"], strict=True)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    assert checkpoint["global_step"] == 5 and len(checkpoint["optimizer_states"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.ckpt", "run"]  # no temporary file left beside it


def test_consolidate_reads_a_checkpoint_from_an_fsspec_url_checking_its_manifest(tmp_path, tiny_trainer_kwargs):
    dirpath = f"memory://consolidate-{tmp_path.name}/run"
    _, model = fit(dirpath, tiny_trainer_kwargs, max_steps=5)
    checkpoint = consolidate_checkpoint(f"{dirpath}/epoch=0-step=5.ckpt", tmp_path / "one.ckpt")
    assert checkpoint["global_step"] == 5
    fresh = CharTransformer(vocab_size=64)
    fresh.load_state_dict(torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"], strict=True)
    assert_same_tensors(fresh.state_dict(), model.state_dict(), "weights")
    store = CheckpointStore(dirpath)
    store.write_bytes("epoch=0-step=5.ckpt/__0_0.distcp", b"damaged")
    with pytest.raises(ValueError, match=r"is damaged \(its file __0_0\.distcp has 7 bytes"):
        consolidate_checkpoint(f"{dirpath}/epoch=0-step=5.ckpt", tmp_path / "two.ckpt")


def test_consolidate_refuses_a_shard_its_manifest_does_not_vouch_for_and_never_replaces_a_file(
    tmp_path, tiny_trainer_kwargs
):
    fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=10, keep_last_k=None)
    step_5, step_10 = tmp_path / "run" / "epoch=0-step=5.ckpt", tmp_path / "run" / "epoch=0-step=10.ckpt"
    shard = step_10 / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # same size: only the sha256 tells
    with pytest.raises(ValueError, match=r"step=10\.ckpt is damaged \(its file __0_0\.distcp does not match"):
        consolidate_checkpoint(step_10, tmp_path / "one.ckpt")
    assert not (tmp_path / "one.ckpt").exists()

    existing = {p: p.read_bytes() for p in step_10.iterdir()}
    for taken in [step_10 / "meta.pt", step_10]:  # a file inside a checkpoint, a checkpoint directory
        with pytest.raises(FileExistsError, match="never replaces a file"):
            consolidate_checkpoint(step_5, taken)
    assert {p: p.read_bytes() for p in step_10.iterdir()} == existing
    with pytest.raises(FileNotFoundError, match="is not a directory: create it first"):
        consolidate_checkpoint(step_5, tmp_path / "missing" / "one.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize(
    ("damaged", "says"),
    [
        (
            ".metadata",
            r"step=5\.ckpt/\.metadata cannot be read \(UnpicklingError: it does not unpickle\): the checkpoint is",
        ),
        (
            "meta.pt",
            r"step=5\.ckpt/meta\.pt cannot be read \(UnpicklingError: it does not unpickle\): the checkpoint is",
        ),
        ("__0_0.distcp", r"Reading the shards of .*step=5\.ckpt failed \(rank 0: .*\): a shard is damaged"),
    ],
    ids=["dcp-metadata", "meta", "shard"],
)
def test_consolidating_a_damaged_checkpoint_without_a_manifest_names_what_is_damaged(
    tmp_path, tiny_trainer_kwargs, capfd, damaged, says
):
    """As Lightning's own model_parallel writes them: no manifest to check first, so the files themselves are read."""
    fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=5)
    step_5 = tmp_path / "run" / "epoch=0-step=5.ckpt"
    (tmp_path / "run" / manifest_name(step_5.name)).unlink()
    target = step_5 / damaged
    target.write_bytes(random.Random(0).randbytes(target.stat().st_size))
    capfd.readouterr()
    with pytest.raises((ValueError, OSError), match=says):
        consolidate_checkpoint(step_5, tmp_path / "one.ckpt")
    assert not (tmp_path / "one.ckpt").exists()
    assert "Traceback" not in capfd.readouterr().err  # torch's fallback to other metadata files logs each failure's


def test_save_last_replaces_the_last_directory_keeping_a_valid_copy_throughout(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path, tiny_trainer_kwargs, max_steps=10, save_last=True, keep_last_k=None)
    store = CheckpointStore(str(tmp_path))
    last = read_manifest(store, "last.ckpt")
    assert last.global_step == 10 and not [n for n in store.names() if ".previous" in n]
    assert {name: digest for name, (_, digest) in last.files.items() if name.endswith(".distcp")} == {
        name: digest
        for name, (_, digest) in read_manifest(store, "epoch=0-step=10.ckpt").files.items()
        if name.endswith(".distcp")
    }  # the same tensors as the step-10 checkpoint
    resumed, _ = fit(tmp_path, tiny_trainer_kwargs, max_steps=12, save_last=True)
    assert resumed.global_step == 12


def test_asynchronous_sharded_saves_resume_bitwise_exact(tmp_path, tiny_trainer_kwargs):
    fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=10, async_save=True)
    newest, _ = find_newest_valid(CheckpointStore(str(tmp_path / "run")))
    assert newest is not None and newest.global_step == 10 and newest.files is not None
    _, resumed = fit(tmp_path / "run", tiny_trainer_kwargs, max_steps=20, async_save=True)
    _, reference = fit(tmp_path / "reference", tiny_trainer_kwargs, max_steps=20)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
