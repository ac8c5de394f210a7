"""The one place where lightning-scale touches private parts of torch (twin of the ``_lightning_internals`` package).

Each has no public equivalent in torch 2.13; ``tests/test_torch_internals.py`` fails loudly when an upgrade moves one:

1. ``FsspecReader``: torch.distributed.checkpoint's reader over fsspec, for sharded checkpoints on object stores (the
   public ``FileSystemReader`` takes local paths only);
2. ``load_state_dict_in_one_process``: DCP's loader with ``no_dist=True`` and a planner that takes every tensor, to
   read a sharded checkpoint whole in one process (consolidation, loading on another world size); the public
   ``dcp.load`` insists on a state dict of the right structure to load into;
3. ``tree_leaves``/``tree_flatten``: torch's pytree, which knows the containers a batch or state dict is made of;
4. ``compress_hook``: the body of torch's fp16/bf16 DDP compression hooks, parameterised by dtype; DDP refuses the
   public ``bf16_compress_hook`` off NCCL by its name, although gloo all-reduces bfloat16;
5. ``files_through``: a ``FileSystemWriter`` whose file access goes through another (public) ``FileSystemBase``, by
   replacing its ``fs`` and ``path`` attributes, as torch's own ``FsspecWriter`` does;
6. ``set_process_group_timeout``: the timeout of the default process group after it was created (documented for
   users, but named with an underscore);
7. ``at_end_of_backward``: autograd's engine runs a callback once the current backward pass is done, as DDP and FSDP
   use to finish their gradient reductions (``Variable._execution_engine.queue_callback``);
8. ``parameter_initialiser``: a module's ``reset_parameters``, or the private ``_reset_parameters`` that some of
   torch's own modules have instead (``nn.MultiheadAttention``), to initialise a block built on the meta device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import _compress_hook as compress_hook
from torch.distributed.checkpoint import StorageReader
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.distributed_c10d import _set_pg_timeout as set_process_group_timeout
from torch.utils._pytree import tree_flatten, tree_leaves

__all__ = [
    "FsspecReader",
    "at_end_of_backward",
    "compress_hook",
    "files_through",
    "load_state_dict_in_one_process",
    "parameter_initialiser",
    "set_process_group_timeout",
    "tree_flatten",
    "tree_leaves",
]


def load_state_dict_in_one_process(state_dict: dict[str, Any], reader: StorageReader) -> None:
    """Fill ``state_dict`` with every tensor of the checkpoint ``reader`` reads, whole, with no collective."""
    _load_state_dict(state_dict, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)


def files_through(writer: FileSystemWriter, files: FileSystemBase, path: str) -> FileSystemWriter:
    """``writer``, writing the checkpoint ``path`` (a URL ``files`` understands) through ``files``."""
    writer.fs = files  # type: ignore[assignment]
    writer.path = path
    return writer


def at_end_of_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the backward pass now running ends (call it from a hook inside that pass)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def parameter_initialiser(module: torch.nn.Module) -> Callable[[], None] | None:
    """``module``'s ``reset_parameters``, else its private ``_reset_parameters`` (``nn.MultiheadAttention``), else
    ``None``."""
    return getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
