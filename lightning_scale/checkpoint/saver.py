"""How checkpoints get written, one saver per mode, chosen once when training starts (:func:`make_saver`).

- :class:`FileSaver`: one file, built on every rank (the state is gathered), written and published by rank 0;
  through a local cache that absorbs the write, the upload to the checkpoint directory runs on rank 0's writer thread.
- :class:`ShardedSaver`: a directory that every rank writes its shards (and its own per-rank values) into; rank 0
  publishes the manifest.
- :class:`BackgroundSaver` (``async_save``): training waits while the state is built and copied to host memory; the
  writing ranks write it on their writer thread, at most one state in flight. Sharded, the writer threads' collectives
  run over a process group of their own.

A save the caller needs durable before it returns (preemption) is ``synchronous``: it waits for what is in flight,
then writes directly. No Lightning here: the caller builds the state, names the manifest fields and reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from lightning_scale import distributed
from lightning_scale.checkpoint.background import BackgroundWriter, HostStager, WriteResult
from lightning_scale.checkpoint.rank_local import rank_local_values
from lightning_scale.checkpoint.rank_zero import on_storage
from lightning_scale.checkpoint.store import CheckpointStorageError
from lightning_scale.checkpoint.writer import CheckpointWriter

__all__ = ["BackgroundSaver", "FileSaver", "SaveHooks", "SaveRequest", "Saver", "ShardedSaver", "make_saver"]


@dataclasses.dataclass(frozen=True)
class SaveRequest:
    """One checkpoint to save: its name in the directory, the step, how every rank builds its state (a collective),
    and the manifest fields for that state."""

    name: str
    step: int
    state: Callable[[], dict[str, Any]]
    fields: Callable[[dict[str, Any]], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class SaveHooks:
    """What a saver reports to its caller: ``durable(seconds)`` when a checkpoint became durable (from building its
    state to its published manifest; on the writer thread for background work), ``landed(results)`` with this rank's
    background results once collected, ``warn(message)`` for a background failure; ``clock`` measures seconds."""

    durable: Callable[[float], None]
    landed: Callable[[list[WriteResult]], None]
    warn: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic


class Saver:
    """Writes checkpoints in one mode. ``save`` returns whether the checkpoint is durable in the directory on return;
    one that is not is reported through the hooks once its background work ended."""

    def __init__(self, files: CheckpointWriter, hooks: SaveHooks) -> None:
        self.files = files
        self.hooks = hooks
        self._writer = BackgroundWriter()

    def save(self, request: SaveRequest, synchronous: bool) -> bool:
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Whether background work of this rank is still running."""
        return self._writer.busy

    def finish(self) -> None:
        """Wait for this rank's background work and report it."""
        results = self._writer.wait()
        if results:
            self.hooks.landed(results)

    def forget_staged(self) -> None:
        """The host copy of the last state may be dropped once queued (see :class:`BackgroundSaver`)."""

    def close(self) -> None:
        self.finish()
        self._writer.close()

    def _storage(self, fn: Callable[[], Any], what: str) -> Any:
        return on_storage(fn, what, self.files.store.url(""))

    def _durable_after(self, started: float) -> None:
        self.hooks.durable(self.hooks.clock() - started)


class FileSaver(Saver):
    """One file per checkpoint, written by rank 0; with a cache, uploaded by rank 0's writer thread (one upload in
    flight at most) unless the save is ``synchronous``."""

    def save(self, request: SaveRequest, synchronous: bool) -> bool:
        started = self.hooks.clock()
        cached = self.files.cache is not None
        if cached:
            self.finish()  # at most one upload in flight
        checkpoint = request.state()  # on every rank: it gathers the full state
        fields = request.fields(checkpoint)
        self._storage(lambda: self.files.write(checkpoint, request.name, fields), f"Saving checkpoint {request.name}")
        if cached and synchronous:  # durable in the directory before it returns
            self._storage(lambda: self.files.upload(request.name), f"Uploading checkpoint {request.name}")
        elif cached:
            if distributed.rank() == 0:
                self._writer.submit(lambda: self._upload(request.name, started), what=request.name)
            return False
        self._durable_after(started)
        return True

    def _upload(self, name: str, started: float) -> None:
        try:
            self.files.upload(name)
        except Exception as err:
            assert self.files.cache is not None
            self.hooks.warn(
                f"Uploading checkpoint {name} to {self.files.store.url('')} failed ({type(err).__name__}: {err}). Its "
                f"local copy stays in {self.files.cache.url('')}; the previous valid checkpoint in dirpath stays the "
                "one to resume from. Training goes on and the next upload tries again."
            )
            raise
        self._durable_after(started)


class ShardedSaver(Saver):
    """A directory per checkpoint: every rank writes its shards in parallel, rank 0 then publishes the manifest of
    all files. ``native``: the state holds the strategy's own shards (its loader reads the directory)."""

    def __init__(self, files: CheckpointWriter, hooks: SaveHooks, native: bool) -> None:
        super().__init__(files, hooks)
        self.native = native

    def save(self, request: SaveRequest, synchronous: bool) -> bool:
        started = self.hooks.clock()
        with rank_local_values():  # each rank writes its own
            checkpoint = request.state()
        try:
            self.files.write_sharded(checkpoint, request.name, request.fields(checkpoint), self.native, group=None)
        except Exception as err:  # raised on every rank alike
            raise CheckpointStorageError(
                f"Saving sharded checkpoint {request.name} failed ({type(err).__name__}: {err}) in "
                f"{self.files.store.url('')}. Earlier checkpoints are untouched; check the storage (space, "
                "permissions, credentials) and re-run to resume."
            ) from err
        self._durable_after(started)
        return True


class BackgroundSaver(Saver):
    """Stages the state in host memory and writes it on this rank's writer thread: rank 0's single file (uploaded
    from the cache when there is one), or every rank's shards over ``group``, the writers' own process group. A state
    staged for a step is reused by a second save of that step (a top-k file and ``last.ckpt``). A failed write is
    reported through ``warn`` and never published: the previous checkpoint stays the one to resume from.
    ``synchronous`` saves go through ``direct`` once the state in flight landed."""

    def __init__(self, direct: FileSaver | ShardedSaver, group: Any) -> None:
        super().__init__(direct.files, direct.hooks)
        self.direct = direct
        self.sharded = isinstance(direct, ShardedSaver)
        self.group = group
        self._stager = HostStager()
        self._staged: tuple[int, dict[str, Any] | None, dict[str, Any]] | None = None

    def save(self, request: SaveRequest, synchronous: bool) -> bool:
        if synchronous:
            self.finish()
            return self.direct.save(request, synchronous=True)
        started = self.hooks.clock()
        if self._staged is None or self._staged[0] != request.step:
            self.finish()  # at most one state in flight
            with rank_local_values() if self.sharded else contextlib.nullcontext():
                checkpoint = request.state()
            writes = self.sharded or distributed.rank() == 0
            self._staged = (request.step, self._stager.copy(checkpoint) if writes else None, request.fields(checkpoint))
        _, staged, fields = self._staged
        if staged is not None:
            self._writer.submit(lambda: self._write(staged, request.name, fields, started), what=request.name)
        return False

    def forget_staged(self) -> None:
        self._staged = None  # the host copy lives only in the writer's queue from here on

    def close(self) -> None:
        super().close()
        self.direct.close()
        self._stager.clear()
        distributed.destroy_group(self.group)
        self.group = None

    def _write(self, staged: dict[str, Any], name: str, fields: dict[str, Any], started: float) -> None:
        try:
            if self.sharded:
                assert isinstance(self.direct, ShardedSaver)
                self.files.write_sharded(staged, name, fields, native=self.direct.native, group=self.group)
            else:
                self.files.write(staged, name, fields)
                if self.files.cache is not None:
                    self.files.upload(name)
        except Exception as err:
            self.hooks.warn(
                f"The background save of checkpoint {name} to {self.files.store.url('')} failed "
                f"({type(err).__name__}: {err}). It was not published; the previous valid checkpoint stays the one to "
                "resume from. Training goes on and the next save tries again."
            )
            raise
        self._durable_after(started)


def make_saver(files: CheckpointWriter, hooks: SaveHooks, sharded: bool, native: bool, background: bool) -> Saver:
    """The saver for this training: call on every rank (a sharded background saver creates its process group)."""
    direct: FileSaver | ShardedSaver
    direct = ShardedSaver(files, hooks, native) if sharded else FileSaver(files, hooks)
    if not background:
        return direct
    group = distributed.new_group("gloo") if sharded else None  # the writer threads' collectives, apart from training's
    return BackgroundSaver(direct, group)
