"""``torch.distributed.checkpoint`` writing each rank's files into a :class:`CheckpointStore` on an object store.

DCP's own fsspec writer streams every file straight into the filesystem: no deadline on a connection that goes
silent, no retry, and a multipart upload that fails stays open (S3 bills its parts). :func:`store_writer` instead
lets DCP serialise each file into a local temporary file, which the store then uploads with a deadline per call,
retries and the clean-up of failed multipart uploads (:meth:`CheckpointStore.put_file`); the temporary file lives on
local disk, not in memory. Local directories keep DCP's own writer (``fsync``\\ ed files).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemBase

from lightning_scale._torch_internals import files_through
from lightning_scale.checkpoint.store import CheckpointStore

__all__ = ["store_writer"]


def store_writer(store: CheckpointStore, name: str) -> dcp.StorageWriter:
    """The DCP storage writer of the checkpoint directory ``name`` of ``store``."""
    url = store.url(name)
    if store.is_local:
        return dcp.FileSystemWriter(url, sync_files=True)
    # DCP joins file names to the URL with concat_path; the store makes each upload durable
    return files_through(dcp.FileSystemWriter(url, sync_files=False), _StoreFiles(CheckpointStore(url)), url)


class _StoreFiles(FileSystemBase):
    """DCP's file access inside one checkpoint directory, through ``store``; paths are ``<directory URL>/<file>``."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    def _name(self, path: str | os.PathLike[str]) -> str:
        return str(path).rstrip("/").rsplit("/", 1)[-1]

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if "r" in mode:
            with self.store.open(self._name(path)) as stream:
                yield stream
            return
        with tempfile.TemporaryDirectory(prefix="lightning-scale-shard-") as local:
            staged = os.path.join(local, "file")
            with open(staged, "wb") as stream:
                yield stream
            self.store.put_file(staged, self._name(path))

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def init_path(self, path: str | os.PathLike[str], **kwargs: Any) -> str:
        return str(path)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.store.publish(self._name(path), self._name(new_path))

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """Object stores have no directories to create."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never chosen by DCP itself

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.store.exists(self._name(path))

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.store.remove(self._name(path))

    def ls(self, path: str | os.PathLike[str]) -> list[str]:
        return [self.concat_path(path, name) for name in self.store.names()]
