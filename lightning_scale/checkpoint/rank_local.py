"""Values of a checkpoint that differ per rank (a rank's data position and RNG states, its ZeRO-1 optimizer shard,
its PowerSGD error feedback): gathered on rank 0 for a single file, kept by each rank for a sharded checkpoint.

The code that builds such a value calls :func:`per_rank` on every rank. Outside a sharded save it gathers every
rank's value on rank 0 (the file's writer) and returns the list there. While a sharded save builds its state
(:func:`rank_local_values`) it returns a :class:`RankLocal` marker instead, with no collective: the sharded writer
takes the markers out (:func:`take_rank_local`), each rank writes its own values into its own file of the checkpoint
directory, and loading puts back a :class:`RankValues` sequence that reads rank ``r``'s file when item ``r`` is first
used (:func:`put_rank_local`). Either way the code that restores the value gets a sequence indexed by the saving
rank, as long as the saving world.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, overload

from lightning_scale import distributed

__all__ = [
    "RankLocal",
    "RankValues",
    "materialize",
    "per_rank",
    "put_rank_local",
    "rank_local_values",
    "saving_per_rank",
    "take_rank_local",
]

PLACEHOLDER_KEY = "lightning_scale_rank_local"

_SHARDED_SAVE: ContextVar[bool] = ContextVar("lightning_scale_sharded_save", default=False)


@dataclasses.dataclass
class RankLocal:
    """This rank's value, left in a checkpoint being built for a sharded save."""

    value: Any


@contextmanager
def rank_local_values() -> Iterator[None]:
    """While a sharded save builds its state: :func:`per_rank` leaves each rank's value with that rank."""
    token = _SHARDED_SAVE.set(True)
    try:
        yield
    finally:
        _SHARDED_SAVE.reset(token)


def saving_per_rank() -> bool:
    """Whether a sharded save is building its state (:func:`per_rank` keeps each value with its rank)."""
    return _SHARDED_SAVE.get()


def per_rank(value: Any) -> Any:
    """What a checkpoint holds for this rank's ``value``; call on every rank while the checkpoint is built.

    Within :func:`rank_local_values`: a :class:`RankLocal` (no collective). Otherwise: every rank's value in rank
    order on rank 0, ``None`` on the others (a gather).
    """
    if _SHARDED_SAVE.get():
        return RankLocal(value)
    return distributed.gather_object(value)


def take_rank_local(checkpoint: Any) -> tuple[Any, list[Any]]:
    """``checkpoint`` with each :class:`RankLocal` replaced by a placeholder, and this rank's values in order (the
    same structure on every rank: the placeholders of rank 0's copy stand for every rank's)."""
    mine: list[Any] = []
    world = distributed.world_size()

    def take(obj: Any) -> Any:
        if isinstance(obj, RankLocal):
            mine.append(obj.value)
            return {PLACEHOLDER_KEY: {"index": len(mine) - 1, "world_size": world}}
        if isinstance(obj, dict):
            return type(obj)((key, take(value)) for key, value in obj.items())
        if isinstance(obj, list):
            return [take(value) for value in obj]
        return obj

    return take(checkpoint), mine


def put_rank_local(checkpoint: Any, read: Callable[[int], list[Any]]) -> Any:
    """``checkpoint`` with each placeholder replaced by a :class:`RankValues` over ``read(rank)`` (the values rank
    ``rank`` wrote, in order)."""
    files = _RankFiles(read)

    def put(obj: Any) -> Any:
        if isinstance(obj, dict) and set(obj) == {PLACEHOLDER_KEY}:
            where = obj[PLACEHOLDER_KEY]
            return RankValues(files, where["index"], where["world_size"])
        if isinstance(obj, dict):
            return type(obj)((key, put(value)) for key, value in obj.items())
        if isinstance(obj, list):
            return [put(value) for value in obj]
        return obj

    return put(checkpoint)


def materialize(checkpoint: Any) -> Any:
    """``checkpoint`` with each :class:`RankValues` read into a list (every rank's file), e.g. to save it as one
    file."""
    if isinstance(checkpoint, RankValues):
        return [materialize(value) for value in checkpoint]
    if isinstance(checkpoint, dict):
        return type(checkpoint)((key, materialize(value)) for key, value in checkpoint.items())
    if isinstance(checkpoint, list):
        return [materialize(value) for value in checkpoint]
    return checkpoint


class _RankFiles:
    """Each rank's values, read once when first needed."""

    def __init__(self, read: Callable[[int], list[Any]]) -> None:
        self._read = read
        self._read_ranks: dict[int, list[Any]] = {}

    def values(self, rank: int) -> list[Any]:
        if rank not in self._read_ranks:
            self._read_ranks[rank] = self._read(rank)
        return self._read_ranks[rank]


class RankValues(Sequence[Any]):
    """Every saving rank's value of one :func:`per_rank` entry, read from that rank's file when first used."""

    def __init__(self, files: _RankFiles, index: int, world_size: int) -> None:
        self._files, self._index, self._world_size = files, index, world_size

    def __len__(self) -> int:
        return self._world_size

    @overload
    def __getitem__(self, rank: int) -> Any: ...

    @overload
    def __getitem__(self, rank: slice) -> list[Any]: ...

    def __getitem__(self, rank: int | slice) -> Any:
        if isinstance(rank, slice):
            return [self[r] for r in range(self._world_size)[rank]]
        if not -self._world_size <= rank < self._world_size:
            raise IndexError(f"rank {rank} of a checkpoint written by {self._world_size} ranks")
        return self._files.values(rank % self._world_size)[self._index]

    def __repr__(self) -> str:
        return f"RankValues(world_size={self._world_size})"
