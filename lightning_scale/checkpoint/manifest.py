"""Checkpoint manifests: what a complete checkpoint is, and which one to resume from.

A checkpoint ``NAME`` is complete only when ``NAME.manifest.json`` exists beside it and the file's size and sha256
match the manifest. The manifest is published after the checkpoint, so a crash at any point leaves either a complete
checkpoint or one that :func:`find_newest_valid` skips with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from lightning_scale.checkpoint.store import CheckpointStore

__all__ = [
    "MANIFEST_SUFFIX",
    "MANIFEST_VERSION",
    "Manifest",
    "find_newest_valid",
    "list_manifests",
    "manifest_name",
    "publish_checkpoint",
    "read_manifest",
    "validate",
]

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1


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
    version: int = MANIFEST_VERSION

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        raw: Any = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError(f"a manifest is a JSON object, not {type(raw).__name__}")
        if raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {raw.get('version')!r} is not {MANIFEST_VERSION}")
        return cls(**raw)


def manifest_name(checkpoint_name: str) -> str:
    return checkpoint_name + MANIFEST_SUFFIX


def publish_checkpoint(
    store: CheckpointStore,
    temporary: str,
    name: str,
    *,
    global_step: int,
    epoch: int,
    run_id: str,
    world_size: int,
    tensor_shapes: dict[str, list[int]],
) -> Manifest:
    """Hash the finished file ``temporary``, rename it to ``name`` and publish its manifest (last)."""
    manifest = Manifest(
        name=name,
        size=store.size(temporary),
        sha256=store.sha256(temporary),
        global_step=global_step,
        epoch=epoch,
        run_id=run_id,
        world_size=world_size,
        created_unix=time.time(),
        tensor_shapes=tensor_shapes,
    )
    store.remove(manifest_name(name))  # an old manifest must never vouch for the new file
    store.publish(temporary, name)
    store.write_bytes(manifest_name(name), manifest.to_json())
    return manifest


def read_manifest(store: CheckpointStore, checkpoint_name: str) -> Manifest:
    """The manifest of ``checkpoint_name``; raises ``FileNotFoundError`` or ``ValueError`` when unusable."""
    return Manifest.from_json(store.read_bytes(manifest_name(checkpoint_name)))


def validate(store: CheckpointStore, manifest: Manifest) -> str | None:
    """Why the checkpoint described by ``manifest`` is unusable, or ``None`` when it is complete and intact."""
    if not store.exists(manifest.name):
        return "the checkpoint file is missing"
    size = store.size(manifest.name)
    if size != manifest.size:
        return f"size is {size} bytes, the manifest says {manifest.size} (truncated or partly written)"
    if store.sha256(manifest.name) != manifest.sha256:
        return "sha256 does not match the manifest (corrupted)"
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
        except (ValueError, TypeError, KeyError):
            orphans.append(name.removesuffix(MANIFEST_SUFFIX))
    manifests.sort(key=lambda m: (m.global_step, m.created_unix), reverse=True)
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
        if chosen is None or _modified_unix(store, name) >= chosen.created_unix:
            skipped.append(f"{store.url(name)}: no valid manifest (the save did not finish)")
    return chosen, skipped


def _modified_unix(store: CheckpointStore, name: str) -> float:
    try:
        return float(store.fs.modified(store.path(name)).timestamp())
    except (OSError, NotImplementedError, AttributeError, ValueError):
        return float("inf")  # unknown age: report it rather than hide it
