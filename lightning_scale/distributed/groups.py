"""Process groups: whether this process has one, and their lifecycle (the default group per torchrun attempt, second
groups for background threads, device meshes, teardown before exit, the parents' coordination store)."""

from __future__ import annotations

import atexit
import gc
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from lightning_scale._torch_internals import set_process_group_timeout

__all__ = [
    "DistributedNotInitializedError",
    "coordination_store",
    "destroy_group",
    "destroy_process_group",
    "destroy_process_group_at_exit",
    "device_mesh",
    "group_ready",
    "has_process_group",
    "init_process_group_per_attempt",
    "new_group",
    "set_timeout",
]


class DistributedNotInitializedError(RuntimeError):
    """The job runs several processes but this one has no ``torch.distributed`` process group."""


def group_ready() -> bool:
    """Whether collectives run: a default group exists (raises :class:`DistributedNotInitializedError` where the
    environment says the job has several processes but there is none)."""
    if dist.is_available() and dist.is_initialized():
        return True
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world > 1:
        raise DistributedNotInitializedError(
            f"WORLD_SIZE={env_world} but torch.distributed has no process group in this process; "
            "collectives must run after the Trainer has set up its strategy (e.g. in `setup` or later hooks)."
        )
    return False


def has_process_group() -> bool:
    """Whether this process has a default process group."""
    return dist.is_available() and dist.is_initialized()


def set_timeout(seconds: float) -> None:
    """Let this rank's collectives in the default group wait up to ``seconds`` from now on (this rank's side of the
    group: no collective)."""
    set_process_group_timeout(timedelta(seconds=seconds))


def coordination_store(host: str, port: int, serve: bool, timeout_s: float, prefix: str = "") -> Any:
    """A TCP key-value store for processes that hold no process group (each rank's warm-restart parent): the server
    on this process when ``serve``, a client otherwise; its keys under ``prefix``. No collective runs on it."""
    store = dist.TCPStore(host, port, is_master=serve, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(prefix, store) if prefix else store


def device_mesh(device_type: str, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A ``DeviceMesh`` over all ranks (every rank must call this, in the same order)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def new_group(backend: str = "gloo") -> Any:
    """A second process group over all ranks (``None`` at world size 1), for collectives that run on another thread
    while training uses the default one; call on every rank, in the same order."""
    if not group_ready() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend=backend)


def destroy_group(group: Any) -> None:
    """Tear down a group made by :func:`new_group` (``None``: nothing to do)."""
    if group is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group(group)


def destroy_process_group(process_ends: bool = False) -> None:
    """Tear down every process group, if any, and collect the garbage that still refers to them, before the process
    exits; call it once the trainer is out of scope.

    A gloo group, or its pending work holding tensors, destroyed during interpreter shutdown can abort the process
    ("terminate called without an active exception"), turning a finished job into exit code -6 for its launcher.
    Lightning's trainer, strategy and callbacks refer to each other, so only the cycle collector frees them (and the
    device meshes, pipeline stages and work they hold): run here, before and after the groups are destroyed, it frees
    them while the interpreter is whole.

    With ``process_ends`` (the caller returns to the interpreter's exit next), what is still alive is frozen out of
    the collector (``gc.freeze``): the interpreter's final collection skips it, as it skips what importing the package
    froze (:mod:`lightning_scale._collector`).
    """
    gc.collect()  # first what still refers to the groups (pending work, meshes), while the groups are whole
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    if process_ends:
        gc.freeze()


def destroy_process_group_at_exit() -> None:
    """Have :func:`destroy_process_group` run as the interpreter exits, before it tears its modules down, when the
    default group is gloo's: for a user's own script, which Lightning leaves with its process group alive
    (``lightning-scale fit`` tears it down itself). Not for NCCL, whose teardown may wait for ranks that a failing one
    cannot count on.

    The exit function was registered when this module was imported: exit functions run last-registered first, so a
    script's own (an ``atexit.register(dist.destroy_process_group)``, a last barrier) runs before it, with the group
    still there, and this one finds nothing left to do."""
    global _teardown_requested
    if has_process_group() and dist.get_backend() == "gloo":
        _teardown_requested = True


_teardown_requested = False


@atexit.register
def _teardown_at_exit() -> None:
    if _teardown_requested and has_process_group():
        destroy_process_group(process_ends=True)


def init_process_group_per_attempt(backend: str, rank: int, world_size: int, timeout: timedelta | None) -> bool:
    """Under torchrun, create the default group with keys of its own for each restart; False when not applicable.

    torchrun shares its rendezvous store with the workers (unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), and that
    store outlives a restart: restarted workers then read the previous attempt's gloo/nccl addresses and fail
    ("connectFullMesh failed ... Connection refused"). A prefix per restart keeps each attempt's keys apart. Single
    node only: across nodes the restart counts differ, so multi-node jobs set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
    ``timeout=None`` (a strategy's ``timeout=None``) keeps torch's default timeouts for the store and the group.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or (dist.is_available() and dist.is_initialized()):
        return False
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        # Each agent counts its own restarts (an agent restarted because another node failed does not count), so
        # the count is no common key across nodes: multi-node jobs need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
        return False
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if timeout is None:
        store = dist.TCPStore(address, port, world_size, is_master=False)
    else:
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"lightning_scale/attempt_{attempt}", store)
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size, timeout=timeout)
    return True
