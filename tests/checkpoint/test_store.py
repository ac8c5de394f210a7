"""Unit tests of CheckpointStore on local disk and on fsspec's in-memory filesystem."""

from __future__ import annotations

import hashlib
import uuid

import fsspec
import pytest

from lightning_scale import knobs
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore


@pytest.fixture(params=["local", "memory"])
def base_dir(request, tmp_path):
    """A directory URL that exists on the chosen backend: a tmp_path, or a unique ``memory://`` folder."""
    if request.param == "local":
        yield str(tmp_path)
        return
    url = f"memory://test-store-{uuid.uuid4().hex}"
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    yield url
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def store(base_dir):
    """A store on an existing, empty checkpoint directory."""
    return CheckpointStore(f"{base_dir}/checkpoints")


@pytest.fixture
def ready_store(store):
    store.fs.makedirs(store.root, exist_ok=True)
    return store


def test_write_bytes_then_read_bytes_round_trips(ready_store):
    data = bytes(range(256)) * 10
    ready_store.write_bytes("a.bin", data)
    assert ready_store.read_bytes("a.bin") == data
    assert ready_store.size("a.bin") == len(data)
    assert ready_store.exists("a.bin")


def test_write_bytes_replaces_an_existing_file_and_leaves_no_temporary(ready_store):
    ready_store.write_bytes("a.bin", b"old contents")
    ready_store.write_bytes("a.bin", b"new")
    assert ready_store.read_bytes("a.bin") == b"new"
    assert ready_store.names() == ["a.bin"]


def test_publish_renames_the_temporary_file_and_leaves_no_temporary(ready_store):
    with ready_store.fs.open(ready_store.path(".a.ckpt.partial"), "wb") as handle:
        handle.write(b"payload")
    ready_store.publish(".a.ckpt.partial", "a.ckpt")
    assert ready_store.names() == ["a.ckpt"]
    assert ready_store.read_bytes("a.ckpt") == b"payload"
    assert not ready_store.exists(".a.ckpt.partial")


def test_publish_replaces_an_existing_file(ready_store):
    ready_store.write_bytes("a.ckpt", b"first")
    with ready_store.fs.open(ready_store.path(".a.ckpt.partial"), "wb") as handle:
        handle.write(b"second")
    ready_store.publish(".a.ckpt.partial", "a.ckpt")
    assert ready_store.read_bytes("a.ckpt") == b"second"
    assert ready_store.names() == ["a.ckpt"]


def test_names_of_a_missing_directory_is_empty(base_dir):
    assert CheckpointStore(f"{base_dir}/does-not-exist").names() == []


def test_names_lists_the_file_names_sorted(ready_store):
    for name in ["b.ckpt", "a.ckpt", "c.json"]:
        ready_store.write_bytes(name, name.encode())
    assert ready_store.names() == ["a.ckpt", "b.ckpt", "c.json"]


def test_remove_deletes_a_file_and_ignores_a_missing_one(ready_store):
    ready_store.write_bytes("a.ckpt", b"x")
    ready_store.remove("a.ckpt")
    assert not ready_store.exists("a.ckpt")
    ready_store.remove("a.ckpt")
    ready_store.remove("never-existed.ckpt")
    assert ready_store.names() == []


def test_sha256_matches_hashlib_across_several_chunks(ready_store, monkeypatch):
    monkeypatch.setattr(knobs, "HASH_CHUNK_BYTES", 7)  # 1000 bytes are read in 143 chunks
    data = bytes((i * 31) % 251 for i in range(1000))
    ready_store.write_bytes("a.bin", data)
    assert ready_store.sha256("a.bin") == hashlib.sha256(data).hexdigest()


def test_url_opens_the_same_file_through_fsspec(ready_store):
    ready_store.write_bytes("a.ckpt", b"through the url")
    with fsspec.open(ready_store.url("a.ckpt"), "rb") as handle:
        assert handle.read() == b"through the url"


def test_check_writable_creates_missing_directories_and_leaves_no_probe(base_dir):
    store = CheckpointStore(f"{base_dir}/new/nested/checkpoints")
    assert not store.fs.exists(store.root)
    store.check_writable()
    assert store.fs.isdir(store.root)
    assert store.names() == []


def test_check_writable_keeps_existing_files_and_leaves_no_probe(ready_store):
    ready_store.write_bytes("a.ckpt", b"x")
    ready_store.check_writable()
    assert ready_store.names() == ["a.ckpt"]


def test_check_writable_under_a_regular_file_raises_an_error_naming_the_dirpath(base_dir):
    fs, root = fsspec.core.url_to_fs(base_dir)
    fs.pipe(f"{root}/not-a-directory", b"a regular file")
    dirpath = f"{base_dir}/not-a-directory/sub"
    with pytest.raises(CheckpointStorageError) as info:
        CheckpointStore(dirpath).check_writable()
    message = str(info.value)
    assert repr(dirpath) in message
    assert "Choose a directory or bucket" in message
    assert "dirpath=" in message
    assert isinstance(info.value, OSError)
    assert info.value.__cause__ is not None
    assert fs.cat(f"{root}/not-a-directory") == b"a regular file"


@pytest.mark.parametrize(("url", "cause"), [("foo://bucket/run", "Protocol not known: foo"), ("gs://b/run", "gcsfs")])
def test_an_unknown_scheme_or_a_missing_filesystem_package_names_the_fix(url, cause):
    with pytest.raises(CheckpointStorageError, match=rf"Cannot open dirpath='{url}'.*{cause}.*s3:// needs s3fs"):
        CheckpointStore(url)
