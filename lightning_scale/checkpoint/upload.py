"""Copying a published checkpoint from one store to another (a local cache to the bucket), with the same guarantees
as a save: the target's manifest is written last, and an older checkpoint of the same name stays valid until then."""

from __future__ import annotations

import contextlib

from lightning_scale.checkpoint.manifest import (
    PARTIAL_SUFFIX,
    Manifest,
    install_checkpoint,
    manifest_name,
    prepare_directory,
    read_manifest,
)
from lightning_scale.checkpoint.store import CheckpointStore

__all__ = ["upload_checkpoint"]


def upload_checkpoint(source: CheckpointStore, target: CheckpointStore, name: str) -> Manifest:
    """Copy checkpoint ``name`` (a file or a sharded directory) from the local store ``source`` to ``target``, and
    publish its manifest there; returns it. Raises ``OSError`` (the target keeps what it had) when a copy fails.

    Examples:
        >>> import tempfile
        >>> from lightning_scale.checkpoint.manifest import publish_checkpoint
        >>> local = CheckpointStore(tempfile.mkdtemp())
        >>> local.write_bytes(".a.ckpt.partial", b"weights")
        >>> fields = dict(global_step=1, epoch=0, run_id="r", world_size=1, tensor_shapes={})
        >>> _ = publish_checkpoint(local, ".a.ckpt.partial", "a.ckpt", **fields)
        >>> bucket = CheckpointStore("memory://upload-example")
        >>> upload_checkpoint(local, bucket, "a.ckpt").size, bucket.read_bytes("a.ckpt")
        (7, b'weights')
    """
    if not source.is_local:
        raise ValueError(f"the source of an upload must be a local directory, not {source.dirpath!r}")
    manifest = read_manifest(source, name)
    if manifest.files is None:
        temporary = f".{name}{PARTIAL_SUFFIX}"
        try:
            target.put_file(source.path(name), temporary)
            install_checkpoint(target, temporary, manifest)
        except Exception:
            with contextlib.suppress(Exception):  # the store may be what failed
                target.remove(temporary)
            raise
        return manifest
    aside = prepare_directory(target, name)
    try:
        for relative in sorted(manifest.files):
            target.put_file(source.path(f"{name}/{relative}"), f"{name}/{relative}")
    except Exception:
        with contextlib.suppress(Exception):
            target.remove(name)
        raise
    target.write_bytes(manifest_name(name), manifest.to_json())
    if aside is not None:
        target.remove(manifest_name(aside))
        target.remove(aside)
    return manifest
