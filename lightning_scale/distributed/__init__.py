"""The only package in lightning-scale that calls ``torch.distributed`` collectives (gloo's ring of sends and receives
in :mod:`lightning_scale.distributed.ring`).

Every function is a no-op at world size 1 and raises :class:`DistributedNotInitializedError` when the environment
says the job has several processes (``WORLD_SIZE`` > 1) but no process group exists, instead of silently acting as
if this rank were alone. Cross-rank decisions are named votes: :func:`any_rank`, :func:`all_ranks`, and
:func:`any_rank_each` for several questions in one collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from lightning_scale.distributed.groups import (
    DistributedNotInitializedError,
    coordination_store,
    destroy_group,
    destroy_process_group,
    destroy_process_group_at_exit,
    device_mesh,
    group_ready,
    has_process_group,
    init_process_group_per_attempt,
    new_group,
    set_timeout,
)
from lightning_scale.distributed.ring import gloo_ring, ring_all_gather, ring_reduce_scatter
from lightning_scale.errors import UsageError

__all__ = [
    "DistributedNotInitializedError",
    "RankFailedError",
    "RankFailedUsageError",
    "all_gather_object",
    "all_gather_stacked",
    "all_gather_start",
    "all_ranks",
    "all_reduce_mean_",
    "all_reduce_sum_",
    "any_rank",
    "any_rank_each",
    "any_rank_each_start",
    "barrier",
    "broadcast_",
    "broadcast_object",
    "coordination_store",
    "destroy_group",
    "destroy_process_group",
    "destroy_process_group_at_exit",
    "device_mesh",
    "gather_object",
    "global_rank_in",
    "has_process_group",
    "init_process_group_per_attempt",
    "new_group",
    "on_every_rank",
    "on_rank_zero",
    "rank",
    "receive_blobs",
    "receive_into",
    "reduce_scatter_start",
    "send_blobs",
    "send_tensor",
    "send_to_others",
    "set_timeout",
    "start_receive",
    "world_size",
]

T = TypeVar("T")


class RankFailedError(RuntimeError):
    """Work that some rank did for the job failed; raised on every rank so that none waits for the others."""


class RankFailedUsageError(RankFailedError, UsageError):
    """A :class:`RankFailedError` whose failure was a usage error on that rank."""


def world_size() -> int:
    """Number of processes in the default group (1 without a process group)."""
    return dist.get_world_size() if group_ready() else 1


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if group_ready() else 0


def _vote_tensor(*values: int) -> torch.Tensor:
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    return torch.tensor(values, dtype=torch.int32, device=device)


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one rank."""
    return any_rank_each([flag])[0]


def any_rank_each(flags: Sequence[bool]) -> list[bool]:
    """For each position, true on every rank when that flag is true on at least one rank: one collective for all."""
    if not group_ready() or dist.get_world_size() == 1:
        return [bool(flag) for flag in flags]
    votes = _vote_tensor(*(int(bool(flag)) for flag in flags))
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return [bool(vote) for vote in votes.tolist()]


def any_rank_each_start(flags: Sequence[bool]) -> Callable[[], list[bool]]:
    """:func:`any_rank_each` without waiting for it: returns the function that waits and gives the answers (every
    rank must start it at the same point of its sequence of collectives)."""
    if not group_ready() or dist.get_world_size() == 1:
        alone = [bool(flag) for flag in flags]
        return lambda: alone
    votes = _vote_tensor(*(int(bool(flag)) for flag in flags))
    work = dist.all_reduce(votes, op=dist.ReduceOp.MAX, async_op=True)
    assert work is not None, "async_op returns its work"

    def answers() -> list[bool]:
        work.wait()
        return [bool(vote) for vote in votes.tolist()]

    return answers


def all_ranks(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on all ranks."""
    if not group_ready() or dist.get_world_size() == 1:
        return bool(flag)
    vote = _vote_tensor(int(bool(flag)))
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    return bool(vote.item())


def all_gather_object(obj: T, group: Any = None) -> list[T]:
    """Every rank's ``obj``, indexed by rank in ``group`` (default: all ranks), on every rank of it."""
    if not group_ready() or dist.get_world_size(group) == 1:
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def all_gather_stacked(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` (the same shape on each), stacked in rank order along a new first dimension."""
    if not group_ready() or dist.get_world_size(group) == 1:
        return tensor.unsqueeze(0)
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    return torch.stack(gathered)


def gather_object(obj: T, dst: int = 0) -> list[T] | None:
    """Every rank's ``obj``, indexed by rank, on rank ``dst``; ``None`` on the other ranks."""
    if not group_ready() or dist.get_world_size() == 1:
        return [obj]
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, gathered, dst=dst)
    return gathered


def broadcast_object(obj: T, src: int = 0, group: Any = None) -> T:
    """Global rank ``src``'s ``obj`` on every rank of ``group`` (default: all ranks)."""
    if not group_ready() or dist.get_world_size(group) == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def send_to_others(tensor: torch.Tensor, group: Any = None, tag: int = 0) -> list[Any]:
    """Start sending ``tensor`` to every other rank of ``group`` (point to point) and return without waiting.

    Unlike a broadcast, the sender goes on at once; each receiver takes it with :func:`start_receive`. With gloo a send
    completes when its receiver has posted the receive: ``wait()`` the returned handles before sending again.
    """
    if not (group_ready() and dist.get_world_size(group) > 1):
        return []
    me = dist.get_rank()
    return [
        dist.isend(tensor, peer, group=group, tag=tag) for peer in dist.get_process_group_ranks(group) if peer != me
    ]


def start_receive(tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0) -> list[Any]:
    """Post the receive of what global rank ``src`` sends with :func:`send_to_others` into ``tensor`` (in place) and
    return without waiting: ``wait()`` the returned handles. Posted early, the transfer completes while this rank
    still computes, and neither side waits for the other."""
    if not (group_ready() and dist.get_world_size(group) > 1):
        return []
    return [dist.irecv(tensor, src=src, group=group, tag=tag)]


def send_blobs(blobs: Sequence[torch.Tensor], dst: int, group: Any = None) -> None:
    """Send flat ``uint8`` CPU tensors to global rank ``dst`` (blocking), which takes them with :func:`receive_blobs`;
    ``group`` must be able to send CPU tensors (gloo)."""
    if not (group_ready() and dist.get_world_size(group) > 1):
        raise RuntimeError("send_blobs needs a process group of more than one rank")
    dist.send(torch.tensor([blob.numel() for blob in blobs], dtype=torch.int64), dst, group=group)
    for blob in blobs:
        if blob.numel():
            dist.send(blob, dst, group=group)


def receive_blobs(count: int, src: int, group: Any = None) -> list[torch.Tensor]:
    """The ``count`` tensors global rank ``src`` sends with :func:`send_blobs`."""
    if not (group_ready() and dist.get_world_size(group) > 1):
        raise RuntimeError("receive_blobs needs a process group of more than one rank")
    sizes = torch.empty(count, dtype=torch.int64)
    dist.recv(sizes, src, group=group)
    blobs = [torch.empty(int(size), dtype=torch.uint8) for size in sizes.tolist()]
    for blob in blobs:
        if blob.numel():
            dist.recv(blob, src, group=group)
    return blobs


def send_tensor(tensor: torch.Tensor, dst: int, group: Any) -> None:
    """Send a CPU tensor to global rank ``dst`` over ``group`` (blocking; gloo), which takes it with
    :func:`receive_into`. Safe from a thread of its own while other threads use other groups."""
    dist.send(tensor, dst, group=group)


def receive_into(tensor: torch.Tensor, src: int, group: Any) -> None:
    """Receive into ``tensor`` (in place) what global rank ``src`` sends with :func:`send_tensor`."""
    dist.recv(tensor, src, group=group)


def all_reduce_sum_(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group``, in place; returns it."""
    if group_ready() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def all_reduce_mean_(tensors: list[torch.Tensor], group: Any = None) -> None:
    """Average each tensor over the ranks of ``group``, in place."""
    if not group_ready() or dist.get_world_size(group) == 1:
        return
    size = dist.get_world_size(group)
    for tensor in tensors:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor.div_(size)


def reduce_scatter_start(output: torch.Tensor, input: torch.Tensor, group: Any = None) -> Any:
    """Start summing ``input`` (the world size times ``output``'s length) over the ranks into each rank's ``output``
    (rank ``r`` gets the ``r``-th segment); returns the work to ``wait()`` on (``None``: done, at world size 1).

    ``input`` is scratch: on gloo it is summed in place. gloo's own reduce-scatter and all-gather are slower than its
    all-reduce of the whole (2 processes, 50 MB: 50 and 42 ms against 31 ms), so on gloo a ring of sends and receives
    runs them on a background thread, in launch order (16 ms per 50 MB on 2 processes).
    """
    if not group_ready() or dist.get_world_size(group) == 1:
        output.copy_(input)
        return None
    if dist.get_backend(group) != "gloo":
        return dist.reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=group, async_op=True)
    return gloo_ring().submit(ring_reduce_scatter, output, input, group)


def all_gather_start(output: torch.Tensor, input: torch.Tensor, group: Any = None) -> Any:
    """Start gathering every rank's ``input`` into ``output``, in rank order; returns the work to ``wait()`` on
    (``None``: done, at world size 1). On gloo, a ring of sends and receives (see :func:`reduce_scatter_start`)."""
    if not group_ready() or dist.get_world_size(group) == 1:
        output.copy_(input)
        return None
    if dist.get_backend(group) != "gloo":
        # torch 2.13 renamed all_gather_into_tensor (deprecated there) all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return gather(output, input, group=group, async_op=True)
    return gloo_ring().submit(ring_all_gather, output, input, group)


def broadcast_(tensors: Sequence[torch.Tensor], src: int = 0, group: Any = None) -> None:
    """Overwrite each tensor with rank ``src``'s, in place: one broadcast per dtype and device."""
    if not group_ready() or dist.get_world_size(group) == 1:
        return
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        kinds.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for same in kinds.values():
        flat = torch.cat([tensor.detach().reshape(-1) for tensor in same])
        dist.broadcast(flat, src, group=group)
        with torch.no_grad():
            for tensor, values in zip(same, flat.split([tensor.numel() for tensor in same]), strict=True):
                tensor.copy_(values.view_as(tensor))


def global_rank_in(group: Any, group_rank: int) -> int:
    """The global rank of ``group``'s member number ``group_rank``."""
    return dist.get_global_rank(group, group_rank) if group_ready() else group_rank


def barrier() -> None:
    """Wait until every rank reaches this call."""
    if group_ready() and dist.get_world_size() > 1:
        dist.barrier()


def _failure(err: Exception) -> tuple[str, bool]:
    """What other ranks learn of ``err``: its message, and whether it is a usage error."""
    return f"{type(err).__name__}: {err}", isinstance(err, UsageError)


def _rank_failed(message: str, usage: bool) -> RankFailedError:
    return (RankFailedUsageError if usage else RankFailedError)(message)


def on_rank_zero(fn: Callable[[], T], group: Any = None) -> T:
    """Run ``fn`` on rank 0 only and return its result on every rank (of ``group``, which must hold rank 0).

    An exception in ``fn`` is raised on every rank as :class:`RankFailedError` (chained from the original on rank 0),
    instead of leaving the other ranks waiting in their next collective.
    """
    outcome: tuple[bool, Any] = (True, None)
    error: Exception | None = None
    if rank() == 0:
        try:
            outcome = (True, fn())
        except Exception as err:
            outcome, error = (False, _failure(err)), err
    ok, value = broadcast_object(outcome, group=group)
    if not ok:
        message, usage = value
        raise _rank_failed(f"rank 0: {message}", usage) from error
    return value


def on_every_rank(fn: Callable[[], T], group: Any = None) -> T:
    """Run ``fn`` on every rank (of ``group``); if it fails on any rank, raise :class:`RankFailedError` on all of
    them."""
    error: Exception | None = None
    value: Any = None
    try:
        value = fn()
    except Exception as err:
        error = err
    failures = all_gather_object(None if error is None else _failure(error), group)
    failed = [(f"rank {r}: {failure[0]}", failure[1]) for r, failure in enumerate(failures) if failure is not None]
    if failed:
        raise _rank_failed("; ".join(message for message, _ in failed), any(usage for _, usage in failed)) from error
    return value
