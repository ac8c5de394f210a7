"""Sharded checkpoints: a directory that every rank writes its part of, through ``torch.distributed.checkpoint``.

::

    NAME/
      .metadata, __<rank>_<n>.distcp    tensors, each rank writing its shards; a tensor that several ranks hold (DDP's
                                         replicas) is written once, the writes spread over the ranks
      meta.pt                            everything else, from rank 0
      rank_<r>.pt                        what differs per rank (data position, RNG, ZeRO-1 shard), from rank r
                                         (:mod:`lightning_scale.checkpoint.rank_local`)

Two layouts share it. Strategies that shard the state themselves (``model_parallel``) use Lightning's: the tensors of
``state_dict`` and ``optimizer_<i>`` in the shards, Lightning's metadata in ``meta.pt``, so Lightning loads it back
into the sharded model. For every other strategy each tensor anywhere in the checkpoint goes into the shards under
its path, and ``meta.pt`` holds the rest with the structure (``SKELETON_KEY``): loading rebuilds the exact dict
(integer keys of optimizer states, lists), which ``torch.distributed.checkpoint``'s own nesting does not.

:func:`save_sharded` and :func:`file_digests` run on every rank (they use collectives); :func:`load_sharded` runs in
one process without any; ``lightning_scale.callbacks._checkpoint_io`` lets Lightning load them.
:func:`load_into_sharded_model` reads Lightning's layout into a model that is sharded already, on every rank, each
reading the byte ranges of its own shards (from local disk or an object store, on any world size: DCP reshards), as
Lightning's own loader does for local paths. Completeness is vouched for by a manifest listing every file with its
size and sha256 (:mod:`lightning_scale.checkpoint.manifest`), which rank 0 publishes last.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from lightning_scale import distributed
from lightning_scale._torch_internals import FsspecReader, load_state_dict_in_one_process
from lightning_scale.checkpoint.damaged import gist, named_if_unreadable
from lightning_scale.checkpoint.dcp_storage import store_writer
from lightning_scale.checkpoint.rank_local import put_rank_local, take_rank_local
from lightning_scale.checkpoint.store import CheckpointStorageError, CheckpointStore

__all__ = [
    "METADATA_FILE",
    "SKELETON_KEY",
    "file_digests",
    "is_sharded_checkpoint",
    "load_into_sharded_model",
    "load_sharded",
    "save_sharded",
]

METADATA_FILE = "meta.pt"
DCP_METADATA_FILE = ".metadata"
SKELETON_KEY = "lightning_scale_sharded"
_LIGHTNING_TENSORS = ("state_dict", "optimizer_states")
_READ_HINT = ": a shard is damaged, or the storage failed; resume from (or consolidate) an intact checkpoint"

Path = tuple[Any, ...]


def save_sharded(
    checkpoint: Mapping[str, Any], store: CheckpointStore, name: str, native: bool, group: Any = None
) -> list[str]:
    """Write ``checkpoint`` (Lightning's dict) as the directory ``name`` of ``store``; call on every rank of ``group``
    (default: all ranks' default group).

    ``native``: the state dict holds the strategy's own shards (written in Lightning's layout for such strategies).
    Returns the directory's file names (the same list on every rank). Raises on every rank when any rank's write
    fails.
    """
    checkpoint, mine = take_rank_local(checkpoint)
    if native:
        tensors = {"state_dict": checkpoint["state_dict"]}
        tensors.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.get("optimizer_states", []))})
        meta = {key: value for key, value in checkpoint.items() if key not in _LIGHTNING_TENSORS}
    else:
        paths: dict[str, Path] = {}
        skeleton = _take_tensors(checkpoint, (), paths)
        tensors = {key: _at(checkpoint, path) for key, path in paths.items()}
        meta = {SKELETON_KEY: {"skeleton": skeleton, "paths": paths}}
    with _storage_errors(f"Writing the shards of {name}"):
        metadata = dcp.save(tensors, storage_writer=store_writer(store, name), process_group=group)
    files = {info.relative_path for info in (metadata.storage_data or {}).values()}
    if mine:  # every rank has the same number
        rank, world = distributed.rank(), distributed.world_size()
        own = f"{name}/{_rank_file(rank)}"
        distributed.on_every_rank(lambda: store.write_with(own, lambda handle: torch.save(mine, handle)), group)
        files |= {_rank_file(r) for r in range(world)}
    distributed.on_rank_zero(
        lambda: store.write_with(f"{name}/{METADATA_FILE}", lambda handle: torch.save(meta, handle)), group
    )
    return sorted(files | {DCP_METADATA_FILE, METADATA_FILE})


@contextmanager
def _storage_errors(what: str, hint: str = "") -> Iterator[None]:
    """DCP's ``CheckpointException`` (a ``BaseException``: ``except Exception`` misses it, and its text is every
    rank's traceback) as a ``CheckpointStorageError`` naming each failed rank's error, then ``hint``."""
    try:
        yield
    except CheckpointException as err:
        failures = "; ".join(f"rank {rank}: {gist(exc)}" for rank, (exc, _) in sorted(err.failures.items()))
        raise CheckpointStorageError(f"{what} failed ({failures}){hint}") from None


def _rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def _take_tensors(obj: Any, path: Path, paths: dict[str, Path]) -> Any:
    """``obj`` with every tensor inside dicts and lists replaced by ``None``; ``paths`` gets ``{key: path}``."""
    if isinstance(obj, torch.Tensor):
        key = ".".join(str(part) for part in path)
        while key in paths:  # an int and a str key that print alike
            key += "~"
        paths[key] = path
        return None
    if isinstance(obj, dict):
        return type(obj)((k, _take_tensors(v, (*path, k), paths)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_take_tensors(v, (*path, i), paths) for i, v in enumerate(obj)]
    return obj


def _at(obj: Any, path: Path) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def file_digests(store: CheckpointStore, name: str, files: list[str], group: Any = None) -> dict[str, list[Any]]:
    """``{file: [size, sha256]}`` for the files of directory ``name``, each hashed by one rank; call on every rank of
    ``group``.

    Raises ``OSError`` on every rank when a file cannot be read on any.
    """
    rank, world = distributed.rank(), distributed.world_size()
    mine: dict[str, list[Any]] = {}
    error = None
    try:
        mine = {f: [store.size(f"{name}/{f}"), store.sha256(f"{name}/{f}")] for f in files[rank::world]}
    except OSError as err:
        error = f"rank {rank}: {type(err).__name__}: {err}"
    merged: dict[str, list[Any]] = {}
    errors = []
    for part, part_error in distributed.all_gather_object((mine, error), group):
        merged.update(part)
        errors += [part_error] if part_error else []
    if errors:
        raise OSError(f"hashing the shards of {name} failed ({'; '.join(errors)})")
    return merged


def is_sharded_checkpoint(path: str) -> bool:
    """Whether ``path`` (local or fsspec URL) is a directory holding a sharded checkpoint."""
    store = CheckpointStore(path)
    return store.exists(DCP_METADATA_FILE) and store.exists(METADATA_FILE)


def _reader(store: CheckpointStore) -> dcp.StorageReader:
    """A reader of the checkpoint in ``store``, whose ``.metadata`` has been read once: a damaged one is refused here,
    naming it, before DCP falls back to other metadata files and logs each failure's traceback."""
    path = store.url("").rstrip("/")
    reader = dcp.FileSystemReader(path) if store.is_local else FsspecReader(path)
    with named_if_unreadable(store.url(DCP_METADATA_FILE)):
        reader.read_metadata()
    return reader


def load_into_sharded_model(
    path: str, module: nn.Module, optimizers: Sequence[Optimizer], strict: bool, weights_only: bool | None = None
) -> dict[str, Any]:
    """Load the sharded checkpoint ``path`` (Lightning's layout: ``state_dict``, ``optimizer_<i>``) into ``module``
    and ``optimizers`` as they are sharded now; call on every rank (it uses collectives). Returns the rest of the
    checkpoint (Lightning's metadata from ``meta.pt``).

    Each rank reads only the parts of the files its shards need, so a checkpoint of any world size loads on this one
    without being copied to one rank first; the model and each optimizer load one after another, as in Lightning.
    """
    store = CheckpointStore(path)
    model_state = {"state_dict": get_model_state_dict(module)}
    with _storage_errors(f"Reading the model's shards from {path}", _READ_HINT):
        dcp.load(model_state, storage_reader=_reader(store))
    module.load_state_dict(model_state["state_dict"], strict=strict)
    for index, optimizer in enumerate(optimizers):
        key = f"optimizer_{index}"
        optimizer_state = {key: get_optimizer_state_dict(module, optimizer)}
        with _storage_errors(f"Reading the optimizer's shards from {path}", _READ_HINT):
            dcp.load(optimizer_state, storage_reader=_reader(store))
        set_optimizer_state_dict(module, optimizer, optimizer_state[key], options=StateDictOptions(cpu_offload=True))
    return _read_meta(store, weights_only)


def _read_meta(store: CheckpointStore, weights_only: bool | None) -> dict[str, Any]:
    """``meta.pt``, each rank's values put back (:func:`~lightning_scale.checkpoint.rank_local.put_rank_local`)."""

    def read(name: str) -> Any:
        with store.fs.open(store.path(name), "rb") as handle, named_if_unreadable(store.url(name)):
            return torch.load(handle, weights_only=weights_only, map_location="cpu")

    meta: dict[str, Any] = put_rank_local(read(METADATA_FILE), lambda rank: read(_rank_file(rank)))
    return meta


def load_sharded(path: str, weights_only: bool | None = None) -> dict[str, Any]:
    """The full checkpoint dict of the sharded directory ``path`` (either layout), every tensor whole, loaded in this
    process without collectives (so it may run while the Trainer restores)."""
    store = CheckpointStore(path)
    reader = _reader(store)
    tensors: dict[str, Any] = {}  # filled from the checkpoint's own metadata, as dcp_to_torch_save does
    with _storage_errors(f"Reading the shards of {path}", _READ_HINT):
        load_state_dict_in_one_process(tensors, reader)
    meta = _read_meta(store, weights_only)
    if SKELETON_KEY not in meta:  # Lightning's layout
        optimizers = sorted((k for k in tensors if k.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
        return {**meta, "state_dict": tensors["state_dict"], "optimizer_states": [tensors[k] for k in optimizers]}
    checkpoint = meta[SKELETON_KEY]["skeleton"]
    for key, path_in in meta[SKELETON_KEY]["paths"].items():
        *parents, last = path_in
        _at(checkpoint, tuple(parents))[last] = tensors[key]
    return checkpoint
