"""Writing checkpoint files and publishing them, manifest last: into the checkpoint directory, or through a local cache
that is then uploaded to it; sharded directories written by every rank; removing checkpoints and the leftovers of
failed writes. No Lightning and no Trainer state: ``ResumableCheckpoint`` decides when and what to save."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from lightning_scale import distributed
from lightning_scale.checkpoint.manifest import (
    PARTIAL_SUFFIX,
    list_manifests,
    manifest_name,
    prepare_directory,
    publish_checkpoint,
    publish_directory,
    read_manifest,
)
from lightning_scale.checkpoint.sharded import file_digests, save_sharded
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.checkpoint.upload import upload_checkpoint

__all__ = ["CheckpointWriter"]


class CheckpointWriter:
    """Writes checkpoints into ``store`` (the checkpoint directory), through ``cache`` (a local directory) when given.

    A single-file checkpoint is written by one rank, with no collectives (so a background thread may write it):
    serialised under a temporary name, then published by its manifest. With a cache it lands there first and
    :meth:`upload` copies it to ``store``, dropping the cached copies up to it. After each checkpoint that landed in
    ``store``, ``retain()`` applies the caller's retention. A write that failed on an unreachable object store may
    leave an open multipart upload behind: it is aborted once a later checkpoint landed, or by
    :meth:`remove_partial_files` at the next start.

    Args:
        store: The checkpoint directory.
        cache: A local directory that absorbs each write before its upload, or ``None``.
        retain: Called on the writing rank after each checkpoint landed in ``store``.
        save_file: ``save_file(checkpoint, url)`` writes a single-file checkpoint's temporary file (a Trainer's
            ``CheckpointIO`` plugin); ``None`` streams ``torch.save`` into it. Either way the file is then made
            durable, hashed into its manifest and published.

    Examples:
        >>> import tempfile
        >>> writer = CheckpointWriter(CheckpointStore(tempfile.mkdtemp()), cache=None, retain=lambda: None)
        >>> fields = dict(global_step=1, epoch=0, run_id="r", generation=0, world_size=1, tensor_shapes={})
        >>> writer.write({"step": 1}, "a.ckpt", fields)
        >>> writer.store.names()
        ['a.ckpt', 'a.ckpt.manifest.json']
    """

    def __init__(
        self,
        store: CheckpointStore,
        cache: CheckpointStore | None,
        retain: Callable[[], None],
        save_file: Callable[[dict[str, Any], str], None] | None = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self._retain = retain
        self._save_file = save_file
        self._write_failed = False

    def remove_partial_files(self) -> None:
        """Remove what unfinished saves left: ``*.partial`` files and open multipart uploads (of single files, and of
        the files of sharded checkpoints: a published one has none open)."""
        for store in self._stores():
            for name in store.names():
                if name.endswith(PARTIAL_SUFFIX):  # a save that never finished; never a checkpoint
                    store.remove(name)
        self.store.abort_unfinished_uploads(PARTIAL_SUFFIX, in_subdirectories=True)
        self._write_failed = False

    def write(self, checkpoint: dict[str, Any], name: str, fields: dict[str, Any]) -> None:
        """Serialise ``checkpoint`` and publish it as ``name`` with the manifest ``fields``: into ``store``, or into
        ``cache`` for :meth:`upload` to copy."""
        store = self.store if self.cache is None else self.cache
        temporary = f".{name}{PARTIAL_SUFFIX}"
        try:
            if self._save_file is None:
                store.write_with(temporary, lambda handle: torch.save(checkpoint, handle))
            else:
                self._save_file(checkpoint, store.url(temporary))
            publish_checkpoint(store, temporary, name, **fields)
        except Exception:
            self._write_failed |= self.cache is None
            with contextlib.suppress(Exception):  # a full disk must not stay full of the failed save
                store.remove(temporary)
            raise
        if self.cache is None:
            self._published()

    def upload(self, name: str) -> None:
        """Copy checkpoint ``name`` from the cache to ``store``, then drop the cached copies up to it (all but a copy
        whose upload failed)."""
        assert self.cache is not None
        try:
            mine = upload_checkpoint(self.cache, self.store, name)
        except Exception:
            self._write_failed = True
            with contextlib.suppress(Exception):
                self._drop_cached(read_manifest(self.cache, name).order, keep_equal=True)
            raise
        self._drop_cached(mine.order, keep_equal=False)
        self._published()

    def write_sharded(
        self, checkpoint: dict[str, Any], name: str, fields: dict[str, Any], native: bool, group: Any
    ) -> None:
        """Every rank of ``group``: write its shards of ``checkpoint`` into the directory ``name``, hash them, and (rank
        0) publish the manifest of all files; raises on every rank if any failed, after rank 0 removed the unfinished
        directory and aborted its open uploads (when the store is unreachable, the next publication or start does).
        ``native``: the state dict holds the strategy's own shards."""
        try:
            aside = distributed.on_rank_zero(lambda: prepare_directory(self.store, name), group)
            files = save_sharded(checkpoint, self.store, name, native, group)
            digests = file_digests(self.store, name, files, group)
            distributed.on_rank_zero(lambda: self._publish_directory(name, digests, aside, fields), group)
        except Exception:
            self._write_failed = True
            if distributed.rank() == 0:
                with contextlib.suppress(Exception):
                    CheckpointStore(self.store.url(name)).abort_unfinished_uploads("")
                with contextlib.suppress(Exception):
                    self.store.remove(name)
            raise

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name`` (and its cached copy), manifest first: a half-removed checkpoint is invalid."""
        for store in self._stores():
            store.remove(manifest_name(name))
            store.remove(name)

    def _publish_directory(
        self, name: str, digests: dict[str, list[Any]], aside: str | None, fields: dict[str, Any]
    ) -> None:
        publish_directory(self.store, name, digests, aside, **fields)
        self._retain()
        if self._write_failed:  # every rank's part of this one landed: what is still open is a failed save's
            with contextlib.suppress(Exception):
                self.store.abort_unfinished_uploads(PARTIAL_SUFFIX, in_subdirectories=True)
                self._write_failed = False

    def _stores(self) -> list[CheckpointStore]:
        return [self.store] if self.cache is None else [self.store, self.cache]

    def _drop_cached(self, order: tuple[int, int, float], keep_equal: bool) -> None:
        assert self.cache is not None
        for manifest in list_manifests(self.cache)[0]:
            if manifest.order < order or (manifest.order == order and not keep_equal):
                self.cache.remove(manifest_name(manifest.name))
                self.cache.remove(manifest.name)

    def _published(self) -> None:
        """After a checkpoint landed in ``store``: retention, and the leftovers of an earlier failed write."""
        self._retain()
        if self._write_failed:  # the store is back: drop what the failed write could not (no other write runs)
            with contextlib.suppress(Exception):
                self.store.abort_unfinished_uploads(PARTIAL_SUFFIX)
                self._write_failed = False
