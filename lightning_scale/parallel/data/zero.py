"""ZeRO stages 1 and 2 over plain torch: each rank owns a 1/world_size chunk of every parameter, the optimizer steps
on those chunks only, gradients are reduce-scattered into them in buckets while backward runs, and the updated chunks
are all-gathered into the parameters after each step.

Layout (as FSDP2's): a parameter of ``n`` elements, flattened, is cut into ``world_size`` chunks of ``ceil(n / W)``
(the last ones shorter or empty); rank ``r`` owns chunk ``r``. A bucket's reduce-scatter input is ``W`` segments, the
``r``-th holding chunk ``r`` of each of its parameters, so one collective per bucket delivers every rank's chunks:
the bytes of one all-reduce in all, split between the reduce-scatter during backward and the all-gather after the
step. The optimizer's parameters are views of the model's own storage (no copy of the weights); it must update each
element from its own gradient and state only, as torch's SGD, Adam(W), RMSprop, Adagrad and their kin do.

Stage 1 keeps one buffer of the gradients' size per rank for the reductions and, while gradients accumulate
(``no_sync``), the full local gradients; stage 2 reduces every backward and allocates its bucket buffers only while
they are in flight (at most two), so a rank holds the gradients of its chunks only.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.optim import Optimizer

from lightning_scale import distributed
from lightning_scale._torch_internals import at_end_of_backward
from lightning_scale.errors import ConfigurationError

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ZeroSharding", "ZeroStage"]

ZeroStage = Literal[1, 2]

ELEMENTWISE_OPTIMIZERS: tuple[type[Optimizer], ...] = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.Adagrad,
    torch.optim.RMSprop, torch.optim.Rprop, torch.optim.NAdam, torch.optim.RAdam, torch.optim.ASGD,
    torch.optim.Adadelta,
)  # fmt: skip
"""Optimizers whose update of an element reads that element's gradient and state only: a chunk steps as the whole."""

_IN_FLIGHT_STAGE_2 = 2


@dataclass(eq=False)
class _Slot:
    """One parameter: its own chunk (``start:stop`` of its flattened elements) and where its chunks sit in a bucket."""

    param: nn.Parameter
    shard: torch.Tensor
    chunk: int
    offset: int
    start: int
    stop: int
    flat: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.flat = self.param.detach().view(-1)


@dataclass(eq=False)
class _Bucket:
    slots: list[_Slot]
    size: int
    buffer: torch.Tensor | None = None
    columns: list[torch.Tensor] = field(default_factory=list)
    reduced: torch.Tensor | None = None
    filled: set[int] = field(default_factory=set)
    work: Any = None
    accumulate: bool = False


def _copy_layout(flat: torch.Tensor, columns: torch.Tensor, into_columns: bool) -> None:
    """Copy a parameter's flattened elements into its columns of every rank's segment (row ``r``: chunk ``r``), or
    back; a parameter that does not fill its last chunk leaves the rest of the columns as they are."""
    world, chunk = columns.shape
    if flat.numel() == world * chunk:
        pair = (columns, flat.view(world, chunk))
        pair[0 if into_columns else 1].copy_(pair[1 if into_columns else 0])
        return
    rows = flat.numel() // chunk
    whole, tail = flat[: rows * chunk].view(rows, chunk), flat[rows * chunk :]
    if into_columns:
        columns[:rows].copy_(whole)
        if tail.numel():
            columns[rows, : tail.numel()].copy_(tail)
    else:
        whole.copy_(columns[:rows])
        if tail.numel():
            tail.copy_(columns[rows, : tail.numel()])


class ZeroSharding:
    """Shards ``optimizer`` (not yet stepped) over the ranks and keeps its parameters' chunks in step.

    After construction :attr:`optimizer` is a new optimizer of the same class, parameter groups and hyperparameters
    over this rank's chunks; step it as usual. Gradients reach it through hooks on the model's parameters; the
    parameters are gathered after each of its steps.

    Args:
        optimizer: The optimizer to shard; every parameter contiguous, dense and on one device.
        stage: 1 or 2 (see the module's documentation).
        bucket_bytes: Gradient bytes per reduction (as DDP's ``bucket_cap_mb``).
        reduce_dtype: Reduce gradients in this dtype (``torch.float16``/``bfloat16``: half the traffic), or ``None``.

    Raises:
        ValueError: the optimizer already holds state, is not elementwise, or a parameter cannot be sharded.
    """

    def __init__(
        self, optimizer: Optimizer, stage: ZeroStage, bucket_bytes: int, reduce_dtype: torch.dtype | None = None
    ) -> None:
        _check_shardable(optimizer)
        self.stage, self.reduce_dtype = stage, reduce_dtype
        self.rank, self.world_size = distributed.rank(), distributed.world_size()
        self.sync = True
        # where the steps' time went, in seconds (see breakdown_ms_per_step)
        self.seconds = {"gradient hooks": 0.0, "end of backward": 0.0, "gather": 0.0}
        self.steps = 0
        slots_of_groups = [[self._slot(p) for p in group["params"]] for group in optimizer.param_groups]
        accepted = _accepted_defaults(optimizer)
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": [slot.shard for slot in slots]}
            for group, slots in zip(optimizer.param_groups, slots_of_groups, strict=True)
        ]
        self.optimizer: Optimizer = type(optimizer)(groups, **accepted)
        self.slots = [slot for slots in slots_of_groups for slot in slots]
        self.buckets = self._buckets(bucket_bytes)
        self._bucket_of = {id(slot.param): (b, i) for b, bucket in enumerate(self.buckets) for i, slot in
                           enumerate(bucket.slots)}  # fmt: skip
        self._next, self._queued = 0, False
        self._handles = [slot.param.register_post_accumulate_grad_hook(self._on_gradient) for slot in self.slots]
        self._handles.append(self.optimizer.register_step_post_hook(lambda *_: self.gather_parameters()))

    def close(self) -> None:
        """Remove the hooks (safe to call twice)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- gradients -------------------------------------------------------------------------------------------------

    def breakdown_ms_per_step(self) -> dict[str, float]:
        """Milliseconds per optimizer step in each part of ZeRO's work: the gradient hooks during backward (copies into
        the buckets, launching reductions), the end of backward (what was not overlapped: the last reductions and the
        hand-over to the optimizer), the gather after the step (packing, all-gather, copies into the parameters)."""
        return {name: seconds * 1e3 / max(1, self.steps) for name, seconds in self.seconds.items()}

    def _on_gradient(self, param: torch.Tensor) -> None:
        if not self.sync and self.stage == 1:
            return  # accumulating: the full gradient stays local until the step's backward
        started = time.perf_counter()
        self._reduce_gradient(param)
        self.seconds["gradient hooks"] += time.perf_counter() - started

    def _reduce_gradient(self, param: torch.Tensor) -> None:
        b, i = self._bucket_of[id(param)]
        bucket = self.buckets[b]
        if i in bucket.filled:
            raise RuntimeError(
                f"A parameter of shape {tuple(param.shape)} received its gradient twice in one backward pass "
                "(reentrant activation checkpointing?); ZeRO reduces each gradient once. Use non-reentrant "
                "checkpointing (use_reentrant=False)."
            )
        if not self._queued:
            at_end_of_backward(self._finish_backward)
            self._queued = True
        self._fill(bucket, i)
        while self._next < len(self.buckets) and len(self.buckets[self._next].filled) == len(
            self.buckets[self._next].slots
        ):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _allocate(self, bucket: _Bucket) -> torch.Tensor:
        """The bucket's reduction buffer, zeros, with each parameter's columns in it."""
        first = bucket.slots[0].param
        bucket.buffer = torch.zeros(self.world_size * bucket.size, dtype=self.reduce_dtype or first.dtype,
                                    device=first.device)  # fmt: skip
        segments = bucket.buffer.view(self.world_size, bucket.size)
        bucket.columns = [segments[:, slot.offset : slot.offset + slot.chunk] for slot in bucket.slots]
        return bucket.buffer

    def _fill(self, bucket: _Bucket, index: int) -> None:
        if bucket.buffer is None:
            self._allocate(bucket)
        slot = bucket.slots[index]
        grad = slot.param.grad
        assert grad is not None, "autograd calls the hook after accumulating a gradient"
        _copy_layout(grad.view(-1), bucket.columns[index], into_columns=True)
        slot.param.grad = None
        bucket.filled.add(index)

    def _launch(self, bucket: _Bucket) -> None:
        # no gradient reached the bucket on this rank: zeros, as DDP reduces unused parameters
        buffer = self._allocate(bucket) if bucket.buffer is None else bucket.buffer
        for i, columns in enumerate(bucket.columns):
            if i not in bucket.filled:  # a persistent buffer still holds the last step's values there
                columns.zero_()
        buffer.div_(self.world_size)
        bucket.accumulate = any(slot.shard.grad is not None for slot in bucket.slots)
        if bucket.reduced is None or bucket.accumulate or bucket.reduced.dtype != buffer.dtype:
            bucket.reduced = torch.empty(bucket.size, dtype=buffer.dtype, device=buffer.device)
        bucket.work = distributed.reduce_scatter_start(bucket.reduced, buffer)
        if self.stage == 2:
            self._bound_in_flight(bucket)

    def _bound_in_flight(self, bucket: _Bucket) -> None:
        """Stage 2: wait for the bucket launched two before this one and drop its buffer."""
        index = next(i for i, candidate in enumerate(self.buckets) if candidate is bucket)
        if index >= _IN_FLIGHT_STAGE_2:
            self._complete(self.buckets[index - _IN_FLIGHT_STAGE_2])

    def _complete(self, bucket: _Bucket) -> None:
        if bucket.work is not None:
            bucket.work.wait()
            bucket.work = None
        if self.stage == 2:  # the columns are views of the buffer: both go
            bucket.buffer, bucket.columns = None, []
        bucket.filled.clear()

    def _finish_backward(self) -> None:
        """At the end of backward: reduce what no gradient reached, wait for every reduction, hand the optimizer its
        chunks' gradients."""
        started = time.perf_counter()
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next])
            self._next += 1
        for bucket in self.buckets:
            self._complete(bucket)
            self._attach(bucket)
        self._next, self._queued = 0, False
        self.seconds["end of backward"] += time.perf_counter() - started

    def _attach(self, bucket: _Bucket) -> None:
        reduced = bucket.reduced
        assert reduced is not None
        for slot in bucket.slots:
            part = reduced[slot.offset : slot.offset + slot.stop - slot.start]
            if part.dtype != slot.shard.dtype:
                part = part.to(slot.shard.dtype)
            if bucket.accumulate and slot.shard.grad is not None:
                slot.shard.grad.add_(part)
            else:
                slot.shard.grad = part
        if bucket.accumulate:
            bucket.reduced = None  # a temporary: the gradients kept their own storage

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the chunks' gradients so that the norm of the whole gradient, over every rank, is at most
        ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_`` on the unsharded model); returns that norm."""
        if math.isinf(norm_type) or norm_type <= 0:
            raise ConfigurationError(f"norm_type={norm_type}: ZeRO clips by a p-norm with 0 < p < inf.")
        grads = [slot.shard.grad for slot in self.slots if slot.shard.grad is not None]
        # summed in float64 over every dtype the parameters have
        powered = torch.zeros((), dtype=torch.float64, device=self.slots[0].param.device)
        for grad in grads:
            powered += torch.linalg.vector_norm(grad, norm_type).double() ** norm_type
        total = distributed.all_reduce_sum_(powered) ** (1.0 / norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coefficient.to(grad.dtype))
        return total

    # -- parameters ------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def gather_parameters(self) -> None:
        """Copy every rank's updated chunks into the parameters (bucket by bucket; stage 2: two in flight)."""
        started = time.perf_counter()
        pending: list[tuple[_Bucket, list[torch.Tensor], Any]] = []
        for bucket in self.buckets:
            first = bucket.slots[0].param
            if self.stage == 1 and bucket.buffer is not None and bucket.buffer.dtype == first.dtype:
                # in place, in the persistent reduction buffer, free until the next backward
                gathered, columns = bucket.buffer, bucket.columns
            else:
                gathered = torch.empty(self.world_size * bucket.size, dtype=first.dtype, device=first.device)
                segments = gathered.view(self.world_size, bucket.size)
                columns = [segments[:, slot.offset : slot.offset + slot.chunk] for slot in bucket.slots]
            own = gathered.view(self.world_size, bucket.size)[self.rank]
            own.zero_()
            for slot in bucket.slots:
                own[slot.offset : slot.offset + slot.stop - slot.start].copy_(slot.shard)
            pending.append((bucket, columns, distributed.all_gather_start(gathered, own)))
            if self.stage == 2 and len(pending) >= _IN_FLIGHT_STAGE_2:
                self._copy_out(*pending.pop(0))
        for item in pending:
            self._copy_out(*item)
        self.seconds["gather"] += time.perf_counter() - started
        self.steps += 1

    def _copy_out(self, bucket: _Bucket, columns: list[torch.Tensor], work: Any) -> None:
        if work is not None:
            work.wait()
        for slot, slot_columns in zip(bucket.slots, columns, strict=True):
            _copy_layout(slot.flat, slot_columns, into_columns=False)

    # -- construction ----------------------------------------------------------------------------------------------

    def _slot(self, param: torch.Tensor) -> _Slot:
        chunk = math.ceil(param.numel() / self.world_size)
        start = min(self.rank * chunk, param.numel())
        stop = min(start + chunk, param.numel())
        return _Slot(param, param.detach().view(-1)[start:stop], chunk, 0, start, stop)  # type: ignore[arg-type]

    def _buckets(self, bucket_bytes: int) -> list[_Bucket]:
        """Buckets in the reverse order of the parameters (about the order backward produces their gradients), each of
        one dtype and device."""
        buckets: list[_Bucket] = []
        current: list[_Slot] = []
        size = 0
        for slot in reversed(self.slots):
            full = (size + slot.chunk) * self.world_size * slot.param.element_size() > bucket_bytes
            other_kind = current and (slot.param.dtype, slot.param.device) != (current[0].param.dtype,
                                                                              current[0].param.device)  # fmt: skip
            if current and (full or other_kind):
                buckets.append(_Bucket(current, size))
                current, size = [], 0
            slot.offset = size
            current.append(slot)
            size += slot.chunk
        if current:
            buckets.append(_Bucket(current, size))
        return buckets

    def state_slots(self) -> Iterator[tuple[int, _Slot]]:
        """Each parameter's index in the optimizer (its key in a state dict) with its slot."""
        yield from enumerate(self.slots)


def _accepted_defaults(optimizer: Optimizer) -> dict[str, Any]:
    # AdamW's defaults include Adam's decoupled_weight_decay, which AdamW's __init__ refuses
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {name: value for name, value in optimizer.defaults.items() if name in accepted}


def _check_shardable(optimizer: Optimizer) -> None:
    name = type(optimizer).__name__
    if optimizer.state:
        raise ConfigurationError(f"{name} already holds state; shard it before its first step.")
    if not isinstance(optimizer, ELEMENTWISE_OPTIMIZERS):
        known = ", ".join(cls.__name__ for cls in ELEMENTWISE_OPTIMIZERS)
        raise ConfigurationError(
            f"ZeRO steps each rank's chunk of every parameter on its own, which is exact only for optimizers that "
            f"update each element from its own gradient and state ({known}); {name} is not one of them. Use "
            "zero_stage=0, or strategy='model_parallel' (FSDP2 keeps each parameter a sharded tensor)."
        )
    params: Sequence[torch.Tensor] = [p for group in optimizer.param_groups for p in group["params"]]
    if len({id(p) for p in params}) != len(params):
        raise ConfigurationError(f"A parameter appears twice in {name}'s parameter groups.")
    for p in params:
        if p.is_sparse or not p.is_contiguous():
            raise ConfigurationError(
                f"A parameter of shape {tuple(p.shape)} is {'sparse' if p.is_sparse else 'not contiguous'} "
                "(channels_last?); ZeRO shards contiguous dense parameters. Keep parameters contiguous, or use "
                "zero_stage=0."
            )
