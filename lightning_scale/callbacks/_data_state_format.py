"""What :class:`~lightning_scale.callbacks.DataStateCheckpoint` keeps per rank in a checkpoint, as typed values.

The checkpoint holds ``{"version": 1, "world_size": W, "ranks": [one dict per rank]}`` (each rank's own in its
``rank_<r>.pt`` for a sharded checkpoint; ``"rank_0"``, ``"rank_1"``, ... keys in earlier releases). These classes read
and write that layout; a field an older release did not write takes its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_scale.data.elastic import EpochPosition

__all__ = ["LoaderState", "RankDataState", "saved_ranks"]


@dataclass
class LoaderState:
    """One training loader of one rank.

    Args:
        state: The loader's ``state_dict()`` at the batch the loop consumed (``None``: a loader without state).
        generators: The states of the loader's and its samplers' ``torch.Generator``\\ s, by where they sit.
    """

    state: dict[str, Any] | None
    generators: dict[str, torch.Tensor]

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "generators": self.generators}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LoaderState:
        return cls(raw["state"], dict(raw.get("generators", {})))


@dataclass
class RankDataState:
    """One rank's data position and RNG states at a checkpoint.

    Args:
        epoch: The epoch being trained.
        end_of_epoch: The checkpoint was taken on the epoch's last batch (a resume starts the next epoch).
        batches_consumed: Batches of the epoch this rank's loop consumed.
        loaders: Each training loader's state (``None``: none were built yet, or another world size's).
        rng: The process's RNG states (``None``: not restored, another world size's).
        drawn_seed: The seed drawn for loaders the user gave none.
        positions: Per training loader, where the job stands in the epoch's global order (``None``: unmeasurable).
        rest_start: The epoch being finished on a new world size, when the checkpoint fell within it.
    """

    epoch: int
    end_of_epoch: bool
    batches_consumed: int = 0
    loaders: list[LoaderState] | None = None
    rng: dict[str, Any] | None = None
    drawn_seed: int | None = None
    positions: list[EpochPosition | None] = field(default_factory=list)
    rest_start: EpochPosition | None = None

    @property
    def first_position(self) -> EpochPosition | None:
        """The position of the one training loader an elastic resume needs (``None``: there is no such loader)."""
        return self.positions[0] if len(self.positions) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's layout."""
        return {
            "epoch": self.epoch,
            "end_of_epoch": self.end_of_epoch,
            "batches_consumed": self.batches_consumed,
            "loaders": [loader.to_dict() for loader in self.loaders or []],
            "rng": self.rng,
            "drawn_seed": self.drawn_seed,
            "positions": [None if p is None else p.to_dict() for p in self.positions],
            "rest_start": None if self.rest_start is None else self.rest_start.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RankDataState:
        """Read the checkpoint's layout; an empty loader list (saved before the training loaders existed, as the
        Tuner's checkpoint is) reads as ``None``."""
        loaders = [LoaderState.from_dict(loader) for loader in raw.get("loaders") or []]
        rest = raw.get("rest_start")
        return cls(
            epoch=int(raw["epoch"]),
            end_of_epoch=bool(raw["end_of_epoch"]),
            batches_consumed=int(raw.get("batches_consumed", 0)),
            loaders=loaders or None,
            rng=raw.get("rng"),
            drawn_seed=raw.get("drawn_seed"),
            positions=[None if p is None else EpochPosition.from_dict(p) for p in raw.get("positions") or []],
            rest_start=None if rest is None else EpochPosition.from_dict(rest),
        )


def saved_ranks(state: dict[str, Any]) -> tuple[int, list[Any]]:
    """The world size that wrote ``state`` and its per-rank entries (raw: in a sharded checkpoint only this rank's
    own entry, or rank 0's, is there to read)."""
    world = int(state["world_size"])
    return world, state.get("ranks") or [state[f"rank_{r}"] for r in range(world)]  # or the old layout
