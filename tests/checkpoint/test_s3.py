"""ResumableCheckpoint against a real S3-protocol server (in-process moto on 127.0.0.1): save, auto-resume, failures."""

from __future__ import annotations

import logging
import random
import threading
import time

import fsspec
import lightning
import pytest
import torch
from lightning.pytorch import Callback, Trainer

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import knobs
from lightning_scale.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_scale.checkpoint.journal import JOURNAL_DIR, RunJournal
from lightning_scale.checkpoint.manifest import find_newest_valid, list_manifests, read_manifest
from lightning_scale.checkpoint.progress import PROGRESS_NAME
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore, UnusableStorageError
from lightning_scale.errors import UsageError
from lightning_scale.strategies import ModelParallelStrategy
from lightning_scale.testing import assert_same_tensors
from tests import fitting
from tests.fitting import AtStep

s3fs = pytest.importorskip("s3fs")


class _StepRecorder(Callback):
    """Records the global step after every optimizer step of a fit."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append(trainer.global_step)


def _fit(dirpath, max_steps, trainer_kwargs, root_dir):
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=5)
    trainer = fitting.fit([checkpoint, recorder], trainer_kwargs, max_steps, default_root_dir=root_dir)
    return trainer, trainer.lightning_module, recorder


def test_training_on_s3_auto_resumes_and_matches_an_uninterrupted_run(s3_bucket, tiny_trainer_kwargs, tmp_path):
    dirpath = f"s3://{s3_bucket}/run"

    first, _, first_steps = _fit(dirpath, 10, tiny_trainer_kwargs, tmp_path / "first")
    assert first.global_step == 10
    assert first_steps.steps == list(range(1, 11))

    resumed, resumed_model, resumed_steps = _fit(dirpath, 20, tiny_trainer_kwargs, tmp_path / "resumed")
    assert resumed.global_step == 20
    assert resumed_steps.steps == list(range(11, 21)), "the second fit did not resume from step 10"

    _, reference_model, reference_steps = _fit(str(tmp_path / "reference"), 20, tiny_trainer_kwargs, tmp_path / "ref")
    assert reference_steps.steps == list(range(1, 21))
    reference = reference_model.state_dict()
    for name, tensor in resumed_model.state_dict().items():
        assert torch.equal(tensor, reference[name]), f"{name} differs from the uninterrupted run"

    store = CheckpointStore(dirpath)
    names = store.names()
    checkpoints = [n for n in names if n.endswith(".ckpt")]
    assert checkpoints == ["epoch=0-step=10.ckpt", "epoch=0-step=15.ckpt", "epoch=0-step=20.ckpt"]  # keep_last_k=3
    assert sorted(names) == sorted(
        [*checkpoints, *(f"{n}.manifest.json" for n in checkpoints), PROGRESS_NAME, JOURNAL_DIR]
    )
    kinds = [event.kind for event in RunJournal(store).events()]  # the run's journal, on an object store too
    assert kinds[0] == "start" and kinds.count("start") == 2 and kinds[-1] == "end" and "checkpoint" in kinds
    assert not [n for n in names if n.endswith(".partial") or ".tmp-" in n or n.startswith(".write-probe")]
    newest, skipped = find_newest_valid(store)
    assert skipped == []
    assert newest == read_manifest(store, "epoch=0-step=20.ckpt")
    assert newest.global_step == 20


def test_check_writable_on_an_unreachable_endpoint_raises_an_error_naming_the_dirpath(unreachable_s3):
    dirpath = "s3://unreachable-bucket/run"
    with pytest.raises(CheckpointStorageError) as info:
        CheckpointStore(dirpath).check_writable()
    message = str(info.value)
    assert repr(dirpath) in message
    assert "check credentials and the endpoint" in message
    assert "EndpointConnectionError" in message
    # an outage, not a mistake: torchrun's next attempt tries again (a usage error would end the job for good)
    assert not isinstance(info.value, UsageError)


def test_unreachable_s3_endpoint_fails_at_fit_start_before_any_step_naming_the_dirpath(
    unreachable_s3, tmp_path, tiny_trainer_kwargs
):
    dirpath = "s3://unreachable-bucket/run"
    lightning.seed_everything(0)
    model = CharTransformer(vocab_size=64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=5)
    trainer = Trainer(max_steps=5, callbacks=[checkpoint, recorder], **tiny_trainer_kwargs)
    try:
        with pytest.raises(CheckpointStorageError) as info:
            trainer.fit(model, datamodule=CharDataModule(batch_size=8))
    finally:
        assert recorder.steps == []
        assert trainer.global_step == 0
        assert_same_tensors(model.state_dict(), before, "weights")
    assert repr(dirpath) in str(info.value)
    assert "check credentials and the endpoint" in str(info.value)
    assert not isinstance(info.value, UsageError)


@pytest.mark.parametrize("bucket", ["missing-bucket", "ab"], ids=["missing", "invalid-name"])
def test_a_bucket_that_does_not_exist_fails_at_fit_start_and_is_not_created(
    s3_bucket, tmp_path, tiny_trainer_kwargs, bucket
):
    dirpath = f"s3://{bucket}/run"
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=5)
    trainer = Trainer(max_steps=5, callbacks=[checkpoint, recorder], **tiny_trainer_kwargs)
    with pytest.raises(UnusableStorageError) as info:
        trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert repr(dirpath) in str(info.value)
    assert "bucket or container does not exist" in str(info.value) and "Create it first" in str(info.value)
    assert recorder.steps == []
    assert bucket not in fsspec.filesystem("s3").ls("", refresh=True)


def test_missing_credentials_fail_at_fit_start_naming_them(s3_bucket, monkeypatch, tiny_trainer_kwargs):
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]:
        monkeypatch.delenv(name)
    s3fs.S3FileSystem.clear_instance_cache()
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=f"s3://{s3_bucket}/run", every_n_train_steps=5)
    trainer = Trainer(max_steps=5, callbacks=[checkpoint, recorder], **tiny_trainer_kwargs)
    with pytest.raises(CheckpointStorageError, match=r"NoCredentialsError: Unable to locate credentials.*credentials"):
        trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert recorder.steps == []


def _fit_big(dirpath, max_steps, trainer_kwargs, callbacks=(), strategy="auto", **checkpoint_kwargs):
    """A fit whose checkpoints weigh ~19 MB (4 upload parts of 5 MiB), saved every 2 steps."""
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=2, keep_last_k=None, **checkpoint_kwargs)
    big = lambda: CharTransformer(vocab_size=64, d_model=256)  # noqa: E731
    fitting.fit(
        [*callbacks, recorder, checkpoint],
        trainer_kwargs,
        max_steps,
        model=big,
        datamodule=CharDataModule(batch_size=8),
        strategy=strategy,
    )
    return checkpoint, recorder


def _published_steps(dirpath: str) -> list[int]:
    return sorted(m.global_step for m in list_manifests(CheckpointStore(dirpath))[0])


def _assert_nothing_half_written(dirpath: str, client, bucket: str) -> None:
    names = CheckpointStore(dirpath).names()
    assert not [n for n in names if n.endswith(".partial") or ".tmp-" in n or "step=4" in n], names
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [], "a failed upload left parts behind"


def test_synchronous_save_during_an_outage_fails_cleanly_and_the_rerun_resumes_once_s3_is_back(
    s3_outage, tiny_trainer_kwargs
):
    proxy, bucket, client = s3_outage
    dirpath = f"s3://{bucket}/run"
    cut_mid_upload = AtStep(4, lambda trainer: proxy.cut_after(2 * 2**20))
    # no memory snapshots: the rerun is to resume from what S3 holds (memory would hold a newer state)
    with pytest.raises(CheckpointStorageError, match=r"Saving checkpoint epoch=0-step=4\.ckpt failed.*untouched"):
        _fit_big(dirpath, 6, tiny_trainer_kwargs, callbacks=[cut_mid_upload], snapshot_every_n_steps=None)
    assert proxy.bytes_up > 2 * 2**20 and not proxy.up  # the cut came in the middle of the step-4 upload

    proxy.restore()
    assert _published_steps(dirpath) == [2]
    newest, skipped = find_newest_valid(CheckpointStore(dirpath))
    assert newest is not None and newest.global_step == 2 and skipped == []
    assert len(client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 1  # the process could not abort it

    _, recorder = _fit_big(
        dirpath,
        6,
        tiny_trainer_kwargs,
        callbacks=[AtStep(3, lambda trainer: _assert_nothing_half_written(dirpath, client, bucket))],
    )  # the same job again, with S3 back
    assert recorder.steps == [3, 4, 5, 6]
    assert _published_steps(dirpath) == [2, 4, 6]


def test_asynchronous_save_during_an_outage_is_reported_training_goes_on_and_the_next_save_lands(
    s3_outage, tiny_trainer_kwargs
):
    proxy, bucket, client = s3_outage
    dirpath = f"s3://{bucket}/run"
    checkpoints: list[ResumableCheckpoint] = []

    def wait_for_the_save_in_flight() -> None:
        while checkpoints[0].save_in_flight:
            time.sleep(0.05)

    def cut_once_the_step_2_save_landed(trainer) -> None:
        wait_for_the_save_in_flight()  # under load it can still be uploading at step 4: the outage is for step 4's
        proxy.cut_after(2 * 2**20)

    def restore_once_the_step_4_save_gave_up(trainer) -> None:
        wait_for_the_save_in_flight()
        proxy.restore()

    callbacks = [AtStep(4, cut_once_the_step_2_save_landed), AtStep(6, restore_once_the_step_4_save_gave_up)]
    original_init = ResumableCheckpoint.__init__

    def remember(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        checkpoints.append(self)

    with (
        pytest.MonkeyPatch.context() as patch,
        pytest.warns(UserWarning, match=r"background save of checkpoint epoch=0-step=4\.ckpt .* failed"),
    ):
        patch.setattr(ResumableCheckpoint, "__init__", remember)
        checkpoint, recorder = _fit_big(dirpath, 8, tiny_trainer_kwargs, callbacks=callbacks, async_save=True)
    assert recorder.steps == list(range(1, 9))
    assert checkpoint.failed_saves == 1
    assert _published_steps(dirpath) == [2, 6, 8]
    _assert_nothing_half_written(dirpath, client, bucket)
    newest, skipped = find_newest_valid(CheckpointStore(dirpath))
    assert newest is not None and newest.global_step == 8 and skipped == []


def test_a_brief_outage_mid_multipart_upload_is_retried_the_checkpoint_lands_whole_and_no_part_is_left(
    s3_outage, tiny_trainer_kwargs, monkeypatch, caplog
):
    proxy, bucket, client = s3_outage
    monkeypatch.setattr(knobs, "STORAGE_BACKOFF_S", 2.0)

    def outage_of_one_second(trainer) -> None:  # outlasts the abort s3fs sends when a part fails, not our backoff
        proxy.cut_after(2 * 2**20)
        threading.Timer(1.0, proxy.restore).start()

    with caplog.at_level(logging.WARNING, logger="lightning_scale.checkpoint.retry"):
        _fit_big(f"s3://{bucket}/run", 4, tiny_trainer_kwargs, callbacks=[AtStep(4, outage_of_one_second)])
    assert "Uploading .epoch=0-step=4.ckpt.partial failed" in caplog.text and "attempt 2/3" in caplog.text
    assert _published_steps(f"s3://{bucket}/run") == [2, 4]
    newest, skipped = find_newest_valid(CheckpointStore(f"s3://{bucket}/run"))
    assert newest is not None and newest.global_step == 4 and skipped == []  # size and sha256 match the manifest
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # the one s3fs could not abort


def test_an_upload_into_a_silent_network_hits_its_deadline_and_the_retry_lands_once_it_is_back(
    s3_outage, monkeypatch, caplog
):
    proxy, bucket, client = s3_outage
    _client_timeouts_at_their_defaults(monkeypatch)
    monkeypatch.setattr(knobs, "STORAGE_CALL_TIMEOUT_S", 2.0)
    store, data = CheckpointStore(f"s3://{bucket}/run"), random.Random(0).randbytes(12 * 2**20)
    proxy.stall_after(2 * 2**20)  # in the middle of a part
    threading.Timer(4.0, proxy.restore).start()  # after the first attempt's deadline (2 s + 12 MiB at 8 MiB/s)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="lightning_scale.checkpoint.retry"):
        store.write_bytes("big.ckpt", data)
    assert time.monotonic() - started < 20  # not the client's 60 s read timeout
    assert "got no answer within 3.5 s" in caplog.text and "attempt 2/3" in caplog.text
    assert store.read_bytes("big.ckpt") == data
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # the cancelled one was aborted


def test_a_network_that_stays_silent_fails_the_upload_at_its_deadline_instead_of_hanging(s3_outage, monkeypatch):
    proxy, bucket, _ = s3_outage
    _client_timeouts_at_their_defaults(monkeypatch)
    monkeypatch.setattr(knobs, "STORAGE_CALL_TIMEOUT_S", 1.0)
    store = CheckpointStore(f"s3://{bucket}/run")
    proxy.stall_after(2 * 2**20)
    started = time.monotonic()
    with pytest.raises(
        TimeoutError, match=r"pipe_file\(.*big\.ckpt.*\) got no answer within 2.5 s.*STORAGE_CALL_TIMEOUT_S"
    ):
        store.write_bytes("big.ckpt", bytes(12 * 2**20))
    assert time.monotonic() - started < 20  # 3 attempts at their 2.5 s deadline and 2 backoffs; not 3 x 60 s


def _client_timeouts_at_their_defaults(monkeypatch) -> None:
    """botocore's read timeout back at its default 60 s (``s3_outage`` shortens it): only our deadline can end a
    stalled call sooner."""
    monkeypatch.setitem(fsspec.config.conf["s3"]["config_kwargs"], "read_timeout", 60)
    s3fs.S3FileSystem.clear_instance_cache()


def test_sharded_checkpoints_on_s3_auto_resume_bitwise_exact(s3_bucket, tiny_trainer_kwargs, tmp_path):
    dirpath = f"s3://{s3_bucket}/sharded"

    def fit(max_steps, dirpath, root):
        lightning.seed_everything(0)
        model = CharTransformer(vocab_size=64)
        checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=5, sharded=True)
        trainer = Trainer(
            max_steps=max_steps, callbacks=[checkpoint], **{**tiny_trainer_kwargs, "default_root_dir": root}
        )
        trainer.fit(model, datamodule=CharDataModule(batch_size=8))
        return model

    fit(5, dirpath, tmp_path / "a")
    manifest = read_manifest(CheckpointStore(dirpath), "epoch=0-step=5.ckpt")
    assert manifest.files is not None and "__0_0.distcp" in manifest.files
    resumed = fit(10, dirpath, tmp_path / "b")
    reference = fit(10, str(tmp_path / "reference"), tmp_path / "c")
    for name, tensor in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name


def test_an_outage_during_an_asynchronous_sharded_save_keeps_the_previous_checkpoint_and_leaves_no_upload_open(
    s3_outage, tiny_trainer_kwargs
):
    """model_parallel's shards uploaded in the background, each through the store (5 MiB parts): the network is cut
    in the middle of the step-4 save. It fails after its retries, is reported and never published; training goes
    on, the next save lands once the network is back, and the failed save's open multipart upload is aborted."""
    proxy, bucket, client = s3_outage
    dirpath = f"s3://{bucket}/run"

    def landed(trainer) -> None:
        while next(cb for cb in trainer.callbacks if isinstance(cb, ResumableCheckpoint)).save_in_flight:
            time.sleep(0.05)

    def cut_once_the_step_2_save_landed(trainer) -> None:
        landed(trainer)
        proxy.cut_after(2 * 2**20)

    def restore_once_the_step_4_save_gave_up(trainer) -> None:
        landed(trainer)
        proxy.restore()

    callbacks = [AtStep(4, cut_once_the_step_2_save_landed), AtStep(6, restore_once_the_step_4_save_gave_up)]
    with pytest.warns(UserWarning, match=r"background save of checkpoint epoch=0-step=4\.ckpt .* failed"):
        checkpoint, recorder = _fit_big(
            dirpath, 8, tiny_trainer_kwargs, callbacks=callbacks, strategy=ModelParallelStrategy(), async_save=True
        )
    assert recorder.steps == list(range(1, 9)) and checkpoint.failed_saves == 1
    assert _published_steps(dirpath) == [2, 6, 8]
    manifest = read_manifest(CheckpointStore(dirpath), "epoch=0-step=8.ckpt")
    assert manifest.files is not None and manifest.files["__0_0.distcp"][0] > 10 * 2**20  # sent as parts
    _assert_nothing_half_written(dirpath, client, bucket)


def test_model_parallel_single_files_written_in_the_background_to_s3_resume(s3_bucket, tiny_trainer_kwargs, tmp_path):
    """The full state gathered on rank 0 (save_distributed_checkpoint=False), saved asynchronously to S3: the same
    fit with more steps resumes from it (Lightning's model-parallel loader reads local paths only)."""
    dirpath = f"s3://{s3_bucket}/run"

    def fit(max_steps: int):
        recorder = _StepRecorder()
        checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=2, async_save=True)
        strategy = ModelParallelStrategy(save_distributed_checkpoint=False)
        fitting.fit([checkpoint, recorder], tiny_trainer_kwargs, max_steps, strategy=strategy)
        return recorder

    fit(4)
    assert (
        _published_steps(dirpath) == [2, 4]
        and read_manifest(CheckpointStore(dirpath), "epoch=0-step=4.ckpt").files is None
    )
    assert fit(6).steps == [5, 6]
