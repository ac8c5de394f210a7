"""ResumableCheckpoint against a real S3-protocol server (in-process moto on 127.0.0.1): save, auto-resume, failures."""

from __future__ import annotations

import logging
import socket
import uuid

import fsspec
import lightning
import pytest
import torch
from lightning.pytorch import Callback, Trainer

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_scale.checkpoint.manifest import find_newest_valid, read_manifest
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


def _point_s3_at(monkeypatch, tmp_path, endpoint_url, **s3_kwargs):
    """Send every s3:// access of fsspec, s3fs and Lightning to ``endpoint_url``, with test credentials, for one test.

    ``FSSPEC_S3_ENDPOINT_URL`` is read only when fsspec is imported, so the endpoint goes into fsspec's config dict,
    which every ``S3FileSystem`` (ours and Lightning's) is built from.
    """
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for name in ["AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint_url, **s3_kwargs})
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_bucket(monkeypatch, tmp_path):
    """A fresh bucket on an in-process moto S3 server; yields its name."""
    werkzeug_log = logging.getLogger("werkzeug")
    werkzeug_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)  # no log line per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        _point_s3_at(monkeypatch, tmp_path, f"http://{host}:{port}")
        bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
        fsspec.filesystem("s3").mkdir(bucket)
        yield bucket
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
        werkzeug_log.setLevel(werkzeug_level)


@pytest.fixture
def closed_port():
    """A 127.0.0.1 port that refuses connections (bound, never listening) for the duration of the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


class _StepRecorder(Callback):
    """Records the global step after every optimizer step of a fit."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append(trainer.global_step)


def _fit(dirpath, max_steps, trainer_kwargs, root_dir):
    lightning.seed_everything(0)
    model = CharTransformer(vocab_size=64)
    data = CharDataModule(batch_size=8)
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=5)
    trainer = Trainer(
        max_steps=max_steps, callbacks=[checkpoint, recorder], **{**trainer_kwargs, "default_root_dir": root_dir}
    )
    trainer.fit(model, datamodule=data)
    return trainer, model, recorder


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
    assert sorted(names) == sorted(checkpoints + [f"{n}.manifest.json" for n in checkpoints])
    assert not [n for n in names if n.endswith(".partial") or ".tmp-" in n or n.startswith(".write-probe")]
    newest, skipped = find_newest_valid(store)
    assert skipped == []
    assert newest == read_manifest(store, "epoch=0-step=20.ckpt")
    assert newest.global_step == 20


@pytest.fixture
def unreachable_s3(monkeypatch, tmp_path, closed_port):
    """s3:// pointed at a closed 127.0.0.1 port, with one attempt and short timeouts so failures take seconds."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    _point_s3_at(
        monkeypatch,
        tmp_path,
        f"http://127.0.0.1:{closed_port}",
        config_kwargs={"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1}},
    )
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_check_writable_on_an_unreachable_endpoint_raises_an_error_naming_the_dirpath(unreachable_s3):
    dirpath = "s3://unreachable-bucket/run"
    with pytest.raises(CheckpointStorageError) as info:
        CheckpointStore(dirpath).check_writable()
    message = str(info.value)
    assert repr(dirpath) in message
    assert "check credentials and the endpoint" in message
    assert "EndpointConnectionError" in message


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
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert repr(dirpath) in str(info.value)
    assert "check credentials and the endpoint" in str(info.value)


def test_bucket_the_server_refuses_to_create_fails_at_fit_start_naming_the_dirpath(
    s3_bucket, tmp_path, tiny_trainer_kwargs
):
    dirpath = "s3://ab/run"  # S3 bucket names need at least 3 characters: the server refuses to create it
    recorder = _StepRecorder()
    checkpoint = ResumableCheckpoint(dirpath=dirpath, every_n_train_steps=5)
    trainer = Trainer(max_steps=5, callbacks=[checkpoint, recorder], **tiny_trainer_kwargs)
    with pytest.raises(CheckpointStorageError) as info:
        trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert repr(dirpath) in str(info.value)
    assert "Choose a directory or bucket" in str(info.value)
    assert recorder.steps == []
    assert "ab" not in fsspec.filesystem("s3").ls("", refresh=True)
