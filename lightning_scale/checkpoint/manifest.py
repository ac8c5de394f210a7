"""Checkpoint manifests: what a complete checkpoint is, and which one to resume from.

A checkpoint ``NAME`` is complete only when ``NAME.manifest.json`` exists beside it and the file's size and sha256
match the manifest. The manifest is published after the checkpoint, so a crash at any point leaves either a complete
checkpoint or one that :func:`find_newest_valid` skips with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import Any

from lightning_scale.checkpoint.store import CheckpointStore

__all__ = [
    "MANIFEST_SUFFIX",
    "MANIFEST_VERSION",
    "PARTIAL_SUFFIX",
    "Manifest",
    "find_newest_valid",
    "install_checkpoint",
    "list_manifests",
    "manifest_name",
    "prepare_directory",
    "publish_checkpoint",
    "publish_directory",
    "read_manifest",
    "validate",
]

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"
PARTIAL_SUFFIX = ".partial"
"""A file being written (``.<name>.partial``): never a checkpoint, removed at the next start."""
MANIFEST_VERSION = 1
PREVIOUS_SUFFIX = ".previous"
UNFINISHED = "no valid manifest (the save did not finish)"
"""How :func:`find_newest_valid` describes a checkpoint file without a manifest."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint file holds, written beside it as ``<name>.manifest.json``."""

    name: str
    size: int
    sha256: str
    global_step: int
    epoch: int
    run_id: str
    world_size: int
    created_unix: float
    tensor_shapes: dict[str, list[int]]
    generation: int = 0
    files: dict[str, list[Any]] | None = None
    """For a sharded checkpoint (a directory): ``{relative file: [size, sha256]}``; ``size``/``sha256`` above are then
    the total size and the sha256 of this listing."""
    version: int = MANIFEST_VERSION

    @property
    def order(self) -> tuple[int, int, float]:
        """Sort key, newest last: a resume from an older checkpoint starts a new generation that supersedes it."""
        return (self.generation, self.global_step, self.created_unix)

    def to_json(self) -> bytes:
        """The manifest as UTF-8 JSON."""
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse a manifest; ``ValueError`` (or ``TypeError`` for unknown fields) when it is not one."""
        raw: Any = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError(f"a manifest is a JSON object, not {type(raw).__name__}")
        if raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {raw.get('version')!r} is not {MANIFEST_VERSION}")
        return cls(**raw)


def manifest_name(checkpoint_name: str) -> str:
    """The name of the manifest that vouches for ``checkpoint_name``."""
    return checkpoint_name + MANIFEST_SUFFIX


def publish_checkpoint(store: CheckpointStore, temporary: str, name: str, **fields: Any) -> Manifest:
    """Hash the finished file ``temporary``, rename it to ``name`` and publish its manifest (last).

    ``fields`` are the remaining :class:`Manifest` fields (``global_step``, ``epoch``, ``run_id``, ...). When ``name``
    already holds a checkpoint (``last.ckpt``, a ``filename`` without ``{step}``), that one is first set aside as
    ``<name>.previous`` with its own manifest, so that a crash at any point leaves a valid copy of the old or the new.
    """
    manifest = Manifest(
        name=name, size=store.size(temporary), sha256=store.sha256(temporary), created_unix=time.time(), **fields
    )
    install_checkpoint(store, temporary, manifest)
    return manifest


def install_checkpoint(store: CheckpointStore, temporary: str, manifest: Manifest) -> None:
    """Rename the finished file ``temporary`` to ``manifest.name`` and publish ``manifest`` (last), setting an old
    checkpoint of that name aside first (see :func:`publish_checkpoint`)."""
    size = store.size(temporary)
    if size != manifest.size:
        raise OSError(f"{temporary} holds {size} bytes, the manifest says {manifest.size}: not published")
    aside = _set_aside(store, manifest.name)
    store.publish(temporary, manifest.name)
    store.write_bytes(manifest_name(manifest.name), manifest.to_json())
    if aside is not None:
        store.remove(manifest_name(aside))
        store.remove(aside)


def prepare_directory(store: CheckpointStore, name: str) -> str | None:
    """Before a sharded checkpoint is written into the directory ``name``: set a valid checkpoint there aside (see
    :func:`publish_checkpoint`), remove anything else (a save that never finished). Returns the set-aside name."""
    aside = _set_aside(store, name)
    store.remove(name)
    return aside


def publish_directory(
    store: CheckpointStore, name: str, files: dict[str, list[Any]], aside: str | None, **fields: Any
) -> Manifest:
    """Publish the manifest of the finished sharded checkpoint ``name`` (``files``: from ``file_digests``), then drop
    the checkpoint ``prepare_directory`` set aside."""
    listing = json.dumps(files, sort_keys=True).encode()
    manifest = Manifest(
        name=name,
        size=sum(size for size, _ in files.values()),
        sha256=hashlib.sha256(listing).hexdigest(),
        created_unix=time.time(),
        files=files,
        **fields,
    )
    store.write_bytes(manifest_name(name), manifest.to_json())
    if aside is not None:
        store.remove(manifest_name(aside))
        store.remove(aside)
    return manifest


def _set_aside(store: CheckpointStore, name: str) -> str | None:
    """Move an existing checkpoint ``name`` to ``<name>.previous``, vouched for at every moment."""
    try:
        old = read_manifest(store, name)
    except (OSError, ValueError, TypeError):
        store.remove(manifest_name(name))  # nothing valid to keep; an old manifest must never vouch for a new file
        return None
    aside = name + PREVIOUS_SUFFIX
    store.remove(manifest_name(aside))  # older than ``name``: left by a crash after the last publication
    store.remove(aside)
    store.write_bytes(manifest_name(aside), dataclasses.replace(old, name=aside).to_json())
    store.publish(name, aside)
    store.remove(manifest_name(name))
    return aside


def read_manifest(store: CheckpointStore, checkpoint_name: str) -> Manifest:
    """The manifest of ``checkpoint_name``; raises ``FileNotFoundError`` or ``ValueError`` when unusable."""
    return Manifest.from_json(store.read_bytes(manifest_name(checkpoint_name)))


def validate(store: CheckpointStore, manifest: Manifest) -> str | None:
    """Why the checkpoint described by ``manifest`` is unusable, or ``None`` when it is complete and intact."""
    if manifest.files is not None:
        return _validate_directory(store, manifest)
    try:
        if not store.exists(manifest.name):
            return "the checkpoint file is missing"
        size = store.size(manifest.name)
        if size != manifest.size:
            return f"size is {size} bytes, the manifest says {manifest.size} (truncated or partly written)"
        if store.sha256(manifest.name) != manifest.sha256:
            return "sha256 does not match the manifest (corrupted)"
    except OSError as err:  # e.g. removed by another process while we read it
        return f"cannot be read ({type(err).__name__}: {err})"
    return None


def _validate_directory(store: CheckpointStore, manifest: Manifest) -> str | None:
    try:
        for relative, (size, sha256) in sorted((manifest.files or {}).items()):
            path = f"{manifest.name}/{relative}"
            if not store.exists(path):
                return f"its file {relative} is missing"
            if store.size(path) != size:
                return f"its file {relative} has {store.size(path)} bytes, the manifest says {size} (partly written)"
            if store.sha256(path) != sha256:
                return f"its file {relative} does not match the manifest's sha256 (corrupted)"
    except OSError as err:
        return f"cannot be read ({type(err).__name__}: {err})"
    return None


def list_manifests(store: CheckpointStore) -> tuple[list[Manifest], list[str]]:
    """Readable manifests, newest first, and the names of ``.ckpt`` files that have no usable manifest."""
    names = store.names()
    manifests: list[Manifest] = []
    orphans = [n for n in names if n.endswith(".ckpt") and manifest_name(n) not in names]
    for name in names:
        if not name.endswith(MANIFEST_SUFFIX):
            continue
        try:
            manifests.append(Manifest.from_json(store.read_bytes(name)))
        except (OSError, ValueError, TypeError, KeyError):
            orphans.append(name.removesuffix(MANIFEST_SUFFIX))
    manifests.sort(key=lambda m: m.order, reverse=True)
    return manifests, orphans


def find_newest_valid(store: CheckpointStore) -> tuple[Manifest | None, list[str]]:
    """The newest complete checkpoint in ``store``, and one line for each newer file that was skipped."""
    manifests, orphans = list_manifests(store)
    skipped: list[str] = []
    chosen: Manifest | None = None
    for manifest in manifests:
        reason = validate(store, manifest)
        if reason is None:
            chosen = manifest
            break
        skipped.append(f"{store.url(manifest.name)}: {reason}")
    for name in orphans:
        if chosen is None or store.modified_unix(name) >= chosen.created_unix:
            skipped.append(f"{store.url(name)}: {UNFINISHED}")
    return chosen, skipped
