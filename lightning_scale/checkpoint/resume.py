"""Which checkpoint a run resumes from, whether it fits the model, which ones are newer than a run's position, and
which ones retention removes: decisions over a checkpoint directory's manifests, no Lightning."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from lightning_scale.checkpoint.manifest import (
    PREVIOUS_SUFFIX,
    UNFINISHED,
    Manifest,
    find_newest_valid,
    list_manifests,
)
from lightning_scale.checkpoint.store import CheckpointStore
from lightning_scale.checkpoint.unvouched import find_newest_unvouched
from lightning_scale.errors import ConfigurationError

__all__ = ["ResumeChoice", "check_same_model", "choose_resume", "expired", "newer_checkpoints", "tensor_shapes"]


@dataclasses.dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint to resume from (``path`` ``None``: none), its manifest (``None`` for a file a stock
    ``ModelCheckpoint`` wrote, checked by its content instead), and one line per newer checkpoint not taken."""

    path: str | None
    manifest: Manifest | None
    skipped: list[str]


def choose_resume(store: CheckpointStore) -> ResumeChoice:
    """The newest valid checkpoint with a manifest; without any, the newest complete training checkpoint that has
    none (a run that switched from ``ModelCheckpoint``)."""
    manifest, skipped = find_newest_valid(store)
    if manifest is not None:
        return ResumeChoice(store.url(manifest.name), manifest, skipped)
    name, unvouched = find_newest_unvouched(store)  # judged by content, so not "unfinished" any more
    skipped = [line for line in skipped if not line.endswith(UNFINISHED)] + unvouched
    return ResumeChoice(None if name is None else store.url(name), None, skipped)


def newer_checkpoints(store: CheckpointStore, position: tuple[int, int]) -> tuple[list[str], int]:
    """Checkpoints in ``store`` ahead of ``(generation, global_step)``, and the highest generation there."""
    manifests, _ = list_manifests(store)
    newer = [m.name for m in manifests if (m.generation, m.global_step) > position]
    return newer, max((m.generation for m in manifests), default=0)


def expired(store: CheckpointStore, run_id: str | None, generation: int, keep: int, last: str | None) -> list[str]:
    """This run's checkpoints of this generation beyond the ``keep`` newest (``last`` and set-aside copies not
    counted); other runs' checkpoints are never among them."""
    manifests, _ = list_manifests(store)
    ours = [
        m.name
        for m in manifests
        if m.run_id == run_id and m.generation == generation and m.name != last and not m.name.endswith(PREVIOUS_SUFFIX)
    ]  # fmt: skip
    return ours[keep:]


def tensor_shapes(state_dict: Mapping[str, Any]) -> dict[str, list[int]]:
    """The shape of every tensor in a model's state dict, as a manifest records it."""
    return {name: list(tensor.shape) for name, tensor in state_dict.items() if isinstance(tensor, torch.Tensor)}


def check_same_model(manifest: Manifest, current: dict[str, list[int]], path: str) -> None:
    """Raise ``ConfigurationError`` naming the differences when the model of ``manifest`` is not the one whose tensor
    shapes are ``current``; nothing is loaded or deleted."""
    if not manifest.tensor_shapes:
        return
    saved = manifest.tensor_shapes
    problems = [f"missing {k!r}" for k in sorted(saved.keys() - current.keys())]
    problems += [f"unexpected {k!r}" for k in sorted(current.keys() - saved.keys())]
    problems += [
        f"{k!r} has shape {current[k]} here but {saved[k]} in the checkpoint"
        for k in sorted(saved.keys() & current.keys())
        if list(saved[k]) != current[k]
    ]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ConfigurationError(
            f"The newest checkpoint {path} was written by a different model ({shown}). Nothing was loaded or "
            "deleted. Use a new dirpath for a new model, or ResumableCheckpoint(auto_resume=False) to start fresh."
        )
