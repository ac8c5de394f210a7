"""A checkpoint directory on local disk or any fsspec URL (``memory://``, ``s3://``, ``gs://``, ...)."""

from __future__ import annotations

import hashlib
import inspect
import io
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import fsspec
from fsspec.asyn import AsyncFileSystem
from fsspec.exceptions import FSTimeoutError
from fsspec.implementations.local import LocalFileSystem

from lightning_scale import knobs
from lightning_scale.checkpoint.retry import is_unreachable, with_retries
from lightning_scale.errors import UsageError

__all__ = ["CheckpointStorageError", "CheckpointStore", "UnusableStorageError"]

log = logging.getLogger(__name__)


OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
"""Protocols whose top-level directory is a bucket or container: checked, never created."""


class CheckpointStorageError(OSError):
    """The checkpoint directory cannot be reached, read or written."""


class UnusableStorageError(CheckpointStorageError, UsageError):
    """``dirpath`` cannot hold checkpoints at all (found before training): a usage error, not an outage to retry."""


class CheckpointStore:
    """File operations on one checkpoint directory, with atomic publication.

    A file is published by writing it under a temporary name, flushing it to stable storage where the filesystem
    allows (``fsync`` on local disk), and renaming it to its final name; readers never see a half-written file
    under a final name. On object stores a rename is a copy, so completeness is signalled by the manifest, which is
    published last (see :mod:`lightning_scale.checkpoint.manifest`). Writes and renames are retried with exponential
    backoff while they fail transiently (:func:`~lightning_scale.checkpoint.retry.with_retries`). On asynchronous
    object stores (s3fs, gcsfs, adlfs) each write, rename and probe has a deadline
    (:data:`~lightning_scale.knobs.STORAGE_CALL_TIMEOUT_S`): a connection that goes silent fails the attempt instead of
    hanging the save.

    Args:
        dirpath: Local directory or fsspec URL of the checkpoint directory.

    Examples:
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
            raise UnusableStorageError(
                f"Cannot open dirpath={self.dirpath!r}: {err}. Use a local path or an fsspec URL whose filesystem is "
                "installed (s3:// needs s3fs, gs:// gcsfs, az:// adlfs)."
            ) from err
        self.root = self.root.rstrip("/") or "/"
        self.is_local = isinstance(self.fs, LocalFileSystem)
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.is_object_store = bool(protocols & OBJECT_STORE_PROTOCOLS)
        self._has_deadlines = isinstance(self.fs, AsyncFileSystem)  # whose blocking calls take timeout=

    def _call(self, method: str, path: str, *args: Any, upload_bytes: int = 0, **kwargs: Any) -> Any:
        """``self.fs.<method>(path, ...)``, with a deadline on asynchronous filesystems: fsspec cancels the call when it
        passes, and this raises a ``TimeoutError`` (transient: retried) naming the path and the knob."""
        if not self._has_deadlines:  # their calls take no timeout
            return getattr(self.fs, method)(path, *args, **kwargs)
        timeout = knobs.STORAGE_CALL_TIMEOUT_S + upload_bytes / knobs.STORAGE_MIN_UPLOAD_BYTES_PER_S
        try:
            return getattr(self.fs, method)(path, *args, timeout=timeout, **kwargs)
        except FSTimeoutError as err:
            raise TimeoutError(
                f"{method}({path!r}) got no answer within {timeout:.1f} s: the storage endpoint is unreachable or "
                "stalled (deadline: LIGHTNING_SCALE_STORAGE_CALL_TIMEOUT_S plus the upload's size at "
                "LIGHTNING_SCALE_STORAGE_MIN_UPLOAD_BYTES_PER_S)"
            ) from err

    def path(self, name: str) -> str:
        """The filesystem path of ``name`` inside the directory (no protocol)."""
        return f"{self.root}/{name}"

    def url(self, name: str) -> str:
        """The path of ``name`` as a user would pass it back to Lightning (protocol kept)."""
        return os.path.join(self.dirpath, name) if self.is_local else f"{self.dirpath.rstrip('/')}/{name}"

    def check_writable(self) -> None:
        """Round-trip a probe file (creating the directory first, but never a bucket), without retries: a wrong
        ``dirpath`` should fail fast. Raises :class:`UnusableStorageError` naming the problem and the fix, or
        :class:`CheckpointStorageError` when the storage did not answer."""
        probe = self.path(f".write-probe-{uuid.uuid4().hex}")
        try:
            if not self.is_object_store:  # which have no directories; and a missing bucket is a mistake to report
                self.fs.makedirs(self.root, exist_ok=True)
            self._call("pipe_file", probe, b"ok")
            if self._call("cat_file", probe) != b"ok":
                raise OSError("the probe file read back differently")
            self._call("rm", probe)
        except Exception as err:
            if isinstance(err, FileNotFoundError) and self.is_object_store:
                raise UnusableStorageError(
                    f"Cannot write checkpoints to dirpath={self.dirpath!r}: its bucket or container does not exist "
                    f"({err}). Create it first (lightning-scale does not create buckets) or fix the name in dirpath."
                ) from err
            # an endpoint that does not answer may be down for a while: a failure to retry, not a usage error
            unreachable = is_unreachable(err)  # FSTimeoutError, botocore's EndpointConnectionError, ...
            raise (CheckpointStorageError if unreachable else UnusableStorageError)(
                f"Cannot write checkpoints to dirpath={self.dirpath!r} ({type(err).__name__}: {err}). "
                "Choose a directory or bucket this job can create and write files in (dirpath=...), "
                "and check credentials and the endpoint for object storage."
            ) from err

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def size(self, name: str) -> int:
        return int(self.fs.size(self.path(name)))

    def modified_unix(self, name: str) -> float:
        """When ``name`` was last written (Unix time); ``inf`` when the filesystem cannot say."""
        try:
            return float(self.fs.modified(self.path(name)).timestamp())
        except (OSError, NotImplementedError, AttributeError, ValueError):
            return float("inf")

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
        # the file is read once, in order: no read-ahead cache (s3fs's held ~200 MB while hashing a 252 MB file)
        with self.fs.open(self.path(name), "rb", block_size=knobs.HASH_CHUNK_BYTES, cache_type="none") as handle:
            while chunk := handle.read(knobs.HASH_CHUNK_BYTES):
                yield chunk

    def open(self, name: str) -> BinaryIO:
        """``name`` opened for reading, seekable (an object store's file is read in ranges as it is read)."""
        return self.fs.open(self.path(name), "rb")

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open(self.path(name), "rb") as handle:
            return handle.read()

    def write_bytes(self, name: str, data: bytes) -> None:
        """Publish ``data`` as ``name`` atomically (temporary name, flush, rename)."""
        temporary = f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        self.write_with(temporary, lambda handle: handle.write(data))
        self.publish(temporary, name)

    def write_advisory(self, name: str, data: bytes) -> None:
        """Write a small advisory file in one attempt, not atomically: its reader must tolerate it torn or missing."""
        self._call("pipe_file", self.path(name), data, upload_bytes=len(data))

    def write_with(self, name: str, write: Callable[[BinaryIO], Any]) -> None:
        """Create ``name`` from what ``write(handle)`` writes, durably; retried whole on transient errors.

        Not atomic: write under a temporary name and :meth:`publish` it. On local disk the bytes stream into the file,
        which is ``fsync``-ed. On an object store they are uploaded once complete: in parts of
        :data:`knobs.UPLOAD_PART_BYTES` sent concurrently where the filesystem takes a part size (s3fs; a failed
        multipart upload is aborted, leaving no parts behind), else in one request.
        """
        if self.is_local:

            def stream() -> None:
                with open(self.path(name), "wb") as handle:
                    keeping = _KeepWriteError(handle)
                    try:
                        write(keeping)  # type: ignore[arg-type]
                    except Exception as err:
                        if keeping.error is not None and keeping.error is not err:
                            raise keeping.error from err  # e.g. ENOSPC, which torch.save reports as "unexpected pos"
                        raise
                    handle.flush()
                    os.fsync(handle.fileno())

            with_retries(stream, f"Writing {self.url(name)}")
            return
        buffer = io.BytesIO()
        write(buffer)
        data = buffer.getvalue()  # no copy: the buffer is not shared
        buffer.close()
        options = self._upload_options()
        self._upload(name, lambda: self._call("pipe_file", self.path(name), data, upload_bytes=len(data), **options))

    def put_file(self, local_path: str, name: str) -> None:
        """Copy the local file ``local_path`` to ``name``, durably; retried whole on transient errors. On an object
        store it streams from the file (s3fs: a multipart upload, :data:`~lightning_scale.knobs.UPLOAD_CONCURRENCY`
        parts in flight), never whole in memory."""
        if self.is_local:
            with open(local_path, "rb") as source:
                self.write_with(name, lambda handle: shutil.copyfileobj(source, handle, 16 * 2**20))
            return
        size = os.path.getsize(local_path)
        options = self._upload_options("put_file")
        self._upload(name, lambda: self._call("put_file", local_path, self.path(name), upload_bytes=size, **options))

    def _upload(self, name: str, attempt: Callable[[], Any]) -> None:
        """``attempt()`` the upload of ``name``, retried whole. A failed attempt can leave its multipart upload open,
        whose parts S3 keeps (and bills) until someone aborts it: one cancelled at its deadline cannot abort it, the
        abort s3fs sends on failure can fail too (the network is down) and, sent while other parts are in flight, may
        leave parts that land after it. So once a later attempt landed, abort what is left of this name's uploads."""
        failed = False

        def attempt_noting_failures() -> None:
            nonlocal failed
            try:
                attempt()
            except Exception:
                failed = True
                raise

        with_retries(attempt_noting_failures, f"Uploading {name}")
        if failed:
            try:
                self.abort_unfinished_uploads(name)  # only this writer writes ``name``: nothing else's upload
            except Exception as err:  # the checkpoint landed; a leftover is worth a warning, not a failed save
                log.warning(f"Could not abort the failed upload of {name} ({type(err).__name__}: {err}).")

    def _upload_options(self, method: str = "pipe_file") -> dict[str, Any]:
        """Part size and parts in flight, where the filesystem's upload takes them (s3fs)."""
        parameters = inspect.signature(getattr(self.fs, f"_{method}", getattr(self.fs, method))).parameters
        options = {"chunksize": knobs.UPLOAD_PART_BYTES, "max_concurrency": knobs.UPLOAD_CONCURRENCY}
        return {name: value for name, value in options.items() if name in parameters}

    def publish(self, temporary: str, name: str) -> None:
        """Make the finished file ``temporary`` durable and rename it to ``name`` (replacing any old ``name``)."""
        if self.is_local:
            _fsync_file(self.path(temporary))
            os.replace(self.path(temporary), self.path(name))
            _fsync_file(self.root)
            return

        def rename() -> None:
            source, target = self.path(temporary), self.path(name)  # a file, or a sharded checkpoint's directory
            if not self._call("exists", source) and self._call("exists", target):
                return  # an earlier attempt renamed it and lost the answer
            if not self._has_deadlines:
                self.fs.mv(source, target, recursive=True)
                return
            # fsspec's mv (a copy, then a removal) passes no timeout on: the same two calls, each with a deadline
            size = self._call("du", source)
            self._call("copy", source, target, recursive=True, on_error="raise", upload_bytes=size)
            self._call("rm", source, recursive=True)

        with_retries(rename, f"Renaming {temporary} to {name}")

    def abort_unfinished_uploads(self, suffix: str, in_subdirectories: bool = False) -> list[str]:
        """Abort the multipart uploads still open for files of this directory named ``*suffix`` (and, with
        ``in_subdirectories``, for every file below its subdirectories: the files of sharded checkpoints); return
        their names relative to this directory.

        An upload that fails while the store is unreachable cannot abort itself, and S3 keeps (and bills) its parts
        until someone does. Only filesystems with multipart uploads (s3fs) have any; elsewhere this returns ``[]``.
        """
        list_uploads, abort = getattr(self.fs, "list_multipart_uploads", None), getattr(self.fs, "abort_mpu", None)
        if list_uploads is None or abort is None:
            return []
        bucket, _, prefix = self.root.strip("/").partition("/")
        aborted = []
        for upload in list_uploads(bucket):
            key = str(upload["Key"])
            directory, _, name = key.rpartition("/")
            below = in_subdirectories and directory.startswith(f"{prefix}/" if prefix else "")
            if (directory == prefix and name.endswith(suffix)) or (below and directory != prefix):
                abort(bucket, key, upload["UploadId"])
                aborted.append(key[len(prefix) + 1 :] if prefix else key)
        return aborted

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        if self.exists(name):
            self.fs.rm(self.path(name), recursive=True)


class _KeepWriteError:
    """A binary file that remembers why a write failed, for writers that replace the error with their own."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
