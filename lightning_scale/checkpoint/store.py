"""A checkpoint directory on local disk or any fsspec URL (``memory://``, ``s3://``, ``gs://``, ...)."""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from lightning_scale import knobs

__all__ = ["CheckpointStorageError", "CheckpointStore"]

log = logging.getLogger(__name__)


class CheckpointStorageError(OSError):
    """The checkpoint directory cannot be reached, read or written."""


class CheckpointStore:
    """File operations on one checkpoint directory, with atomic publication.

    A file is published by writing it under a temporary name, flushing it to stable storage where the filesystem
    allows (``fsync`` on local disk), and renaming it to its final name; readers never see a half-written file
    under a final name. On object stores a rename is a copy, so completeness is signalled by the manifest, which is
    published last (see :mod:`lightning_scale.checkpoint.manifest`).

    Args:
        dirpath: Local directory or fsspec URL of the checkpoint directory.

    Example:
        >>> store = CheckpointStore("memory://example-store")
        >>> store.write_bytes("a.txt", b"hello")
        >>> store.read_bytes("a.txt")
        b'hello'
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = str(dirpath)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.dirpath)
        except (ValueError, ImportError) as err:  # an unknown scheme, or a known one whose package is missing
            raise CheckpointStorageError(
                f"Cannot open dirpath={self.dirpath!r}: {err}. Use a local path or an fsspec URL whose filesystem is "
                "installed (s3:// needs s3fs, gs:// gcsfs, az:// adlfs)."
            ) from err
        self.root = self.root.rstrip("/") or "/"
        self.is_local = isinstance(self.fs, LocalFileSystem)

    def path(self, name: str) -> str:
        """The filesystem path of ``name`` inside the directory (no protocol)."""
        return f"{self.root}/{name}"

    def url(self, name: str) -> str:
        """The path of ``name`` as a user would pass it back to Lightning (protocol kept)."""
        return os.path.join(self.dirpath, name) if self.is_local else f"{self.dirpath.rstrip('/')}/{name}"

    def check_writable(self) -> None:
        """Create the directory and round-trip a probe file; raise :class:`CheckpointStorageError` if that fails."""
        probe = f".write-probe-{uuid.uuid4().hex}"
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            self.write_bytes(probe, b"ok")
            if self.read_bytes(probe) != b"ok":
                raise OSError("the probe file read back differently")
            self.fs.rm(self.path(probe))
        except Exception as err:
            raise CheckpointStorageError(
                f"Cannot write checkpoints to dirpath={self.dirpath!r} ({type(err).__name__}: {err}). "
                "Choose a directory or bucket this job can create and write files in (dirpath=...), "
                "and check credentials and the endpoint for object storage."
            ) from err

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def size(self, name: str) -> int:
        return int(self.fs.size(self.path(name)))

    def names(self) -> list[str]:
        """Names of the files directly inside the directory; empty when it does not exist."""
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(os.path.basename(str(entry).rstrip("/")) for entry in entries)

    def sha256(self, name: str) -> str:
        digest = hashlib.sha256()
        for chunk in self._chunks(name):
            digest.update(chunk)
        return digest.hexdigest()

    def _chunks(self, name: str) -> Iterator[bytes]:
        with self.fs.open(self.path(name), "rb") as handle:
            while chunk := handle.read(knobs.HASH_CHUNK_BYTES):
                yield chunk

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open(self.path(name), "rb") as handle:
            return handle.read()

    def write_bytes(self, name: str, data: bytes) -> None:
        """Publish ``data`` as ``name`` atomically (temporary name, flush, rename)."""
        temporary = f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open(self.path(temporary), "wb") as handle:
            handle.write(data)
        self.publish(temporary, name)

    def publish(self, temporary: str, name: str) -> None:
        """Make the finished file ``temporary`` durable and rename it to ``name`` (replacing any old ``name``)."""
        if self.is_local:
            _fsync_file(self.path(temporary))
            os.replace(self.path(temporary), self.path(name))
            _fsync_file(self.root)
        else:
            self.fs.mv(self.path(temporary), self.path(name))

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        if self.exists(name):
            self.fs.rm(self.path(name), recursive=True)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
