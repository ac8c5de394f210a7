"""Gradient compression for DDP: torch's communication hooks by name, and PowerSGD state that resumes exactly.

The hooks are torch's own (``fp16_compress_hook``, ``bf16_compress_hook``, ``powerSGD_hook``); off NCCL, bf16 runs
under another name, since DDP refuses torch's by name although gloo all-reduces bfloat16. PowerSGD keeps running
state per DDP *bucket* (error feedback, warm-start matrices) laid out in the bucket's parameter order, and DDP lays
buckets out differently in a process's first iteration than after it rebuilds them. :class:`PowerSGDHook` therefore
re-lays that state out when a bucket's parameters change, and saves it per parameter (as tensors and numbers
``torch.load(weights_only=True)`` reads), so a resumed run continues the compression exactly."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from lightning_scale._torch_internals import compress_hook
from lightning_scale.errors import ConfigurationError

__all__ = [
    "COMPRESSIONS",
    "Compression",
    "CompressionHook",
    "PowerSGDHook",
    "check_powersgd_settings",
    "compression_hook",
]

Compression = Literal["none", "fp16", "bf16", "powersgd"]
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "powersgd")
_COUNTERS = ("iter", "next_stats_report", "total_numel_before_compression", "total_numel_after_compression")
Layout = tuple[tuple[int, tuple[int, ...]], ...]  # a bucket's (parameter index, gradient shape), in bucket order


class PowerSGDHook:
    """torch's ``powerSGD_hook`` with state that survives DDP's bucket rebuilds and checkpoints.

    Call :meth:`bind` with the module's parameters, then register :meth:`hook` on the DDP module.
    """

    def __init__(self, state: powerSGD_hook.PowerSGDState) -> None:
        self.state = state
        self._index: dict[int, int] = {}  # parameter data_ptr -> position in module.parameters()
        self._layouts: dict[int, Layout] = {}  # bucket index -> the layout its state is in
        self._pieces: dict[int, dict[str, Tensor]] = {}  # parameter index -> its error / P / Q, between layouts
        self._iteration = 0  # DDP iterations seen (one ends with the bucket that is_last())
        self._reduced_in: dict[int, int] = {}  # bucket index -> the iteration it was last reduced in

    def bind(self, parameters: Iterable[Tensor]) -> None:
        self._index = {p.data_ptr(): i for i, p in enumerate(parameters)}

    @property
    def hook(self) -> Any:
        """The function to register (DDP wants a function: it reads its name and checks its annotations)."""

        def powerSGD_hook(state, bucket):  # no annotations: DDP checks them
            return self._reduce(state, bucket)

        return powerSGD_hook

    def _reduce(self, state: powerSGD_hook.PowerSGDState, bucket: Any) -> Any:
        index = bucket.index()
        layout = tuple(
            (self._index[p.data_ptr()], tuple(g.shape))
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)
        )
        if self._layouts.get(index) != layout:
            # DDP rebuilt its buckets (or state came from a checkpoint): take apart the state of every bucket not yet
            # reduced in this iteration (their parameters may now sit in this one; the others may have callbacks in
            # flight and keep their layout), then lay this bucket's parameters out in its order
            stale = [i for i in self._layouts if self._reduced_in.get(i) != self._iteration]
            self._pieces.update(self._split(stale))
            for i in stale:
                self._drop(i)
            self._assemble(index, layout, bucket.buffer().device)
            self._layouts[index] = layout
        self._reduced_in[index] = self._iteration
        if bucket.is_last():
            self._iteration += 1
        return powerSGD_hook.powerSGD_hook(state, bucket)

    def state_dict(self) -> dict[str, Any]:
        """The running state, per parameter, as tensors and numbers."""
        legacy = self.state.rng.get_state(legacy=True)
        assert isinstance(legacy, tuple)  # a RandomState is MT19937, whose legacy state is a tuple
        name, keys, position, has_gauss, cached_gaussian = legacy
        rng = {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
               "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}  # fmt: skip
        counters = {name: int(getattr(self.state, name)) for name in _COUNTERS}
        pieces = {**self._pieces, **self._split(list(self._layouts))}
        pieces = {param: {kind: t.cpu() for kind, t in kinds.items()} for param, kinds in pieces.items()}
        return {"pieces": pieces, "rng": rng, **counters}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        for name in _COUNTERS:
            setattr(self.state, name, saved[name])
        rng = saved["rng"]
        keys = rng["keys"].numpy().astype(np.uint32)
        self.state.rng.set_state((rng["name"], keys, rng["position"], rng["has_gauss"], rng["cached_gaussian"]))
        for index in list(self._layouts):
            self._drop(index)
        self._pieces = dict(saved["pieces"])  # laid out into buckets as each bucket is first reduced

    # ------------------------------------------------------------------------------------------------------ layout

    def _drop(self, index: int) -> None:
        for flat in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
            flat.pop(index, None)
        self._layouts.pop(index, None)

    def _slices(self, layout: Layout) -> dict[int, dict[str, tuple[int, int]]]:
        """Where each parameter's error, P and Q sit in the bucket's flat tensors (as ``powerSGD_hook`` lays them)."""
        slices: dict[int, dict[str, tuple[int, int]]] = {}
        offset = 0
        by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}  # PowerSGD groups its matrices by shape
        for param, shape in layout:
            numel = int(np.prod(shape))
            slices[param] = {"error": (offset, numel)}
            offset += numel
            n, m = shape[0], numel // shape[0]
            r = min(n, m, self.state.matrix_approximation_rank)
            if (n + m) * r * self.state.min_compression_rate < n * m:
                by_shape.setdefault((n, m), []).append((param, r))
        p_offset = q_offset = 0
        for (n, m), params in by_shape.items():
            for param, r in params:
                slices[param]["p"], slices[param]["q"] = (p_offset, n * r), (q_offset, m * r)
                p_offset, q_offset = p_offset + n * r, q_offset + m * r
        return slices

    def _split(self, indices: list[int]) -> dict[int, dict[str, Tensor]]:
        """Each parameter's error / P / Q out of the flat state of the buckets ``indices`` (copies)."""
        flats = {"error": self.state.error_dict, "p": self.state.p_memory_dict, "q": self.state.q_memory_dict}
        pieces: dict[int, dict[str, Tensor]] = {}
        for index in indices:
            for param, where in self._slices(self._layouts[index]).items():
                for kind, (start, length) in where.items():
                    if index in flats[kind]:
                        pieces.setdefault(param, {})[kind] = flats[kind][index][start : start + length].clone()
        return pieces

    def _assemble(self, index: int, layout: Layout, device: torch.device) -> None:
        slices = self._slices(layout)
        flats = {"error": self.state.error_dict, "p": self.state.p_memory_dict, "q": self.state.q_memory_dict}
        for kind, target in flats.items():
            # in memory order: P and Q are grouped by matrix shape, not in bucket order
            wanted = sorted(
                ((param, where[kind]) for param, where in slices.items() if kind in where), key=lambda w: w[1]
            )
            if wanted and all(kind in self._pieces.get(param, {}) for param, _ in wanted):
                target[index] = torch.cat([self._pieces[param][kind] for param, _ in wanted]).to(device)
        for param, _ in layout:
            self._pieces.pop(param, None)


@dataclass
class CompressionHook:
    """A DDP communication hook and its state, ready for ``DistributedDataParallel.register_comm_hook(state, hook)``."""

    state: Any
    hook: Any
    powersgd: PowerSGDHook | None = None  # PowerSGD's own state, for checkpoints


def bf16_hook(process_group, bucket):  # no annotations: DDP checks them
    """torch's bf16 compression (cast to bfloat16, divide by the world size, all-reduce, cast back) on any backend.

    DDP refuses torch's own ``bf16_compress_hook`` off NCCL (by its name), yet gloo all-reduces bfloat16 fine; this is
    the same computation under another name.
    """
    return compress_hook(torch.bfloat16, process_group, bucket)


def check_powersgd_settings(powersgd_rank: int, powersgd_warmup_steps: int) -> None:
    """Raise ``ValueError`` naming the argument when PowerSGD would reject a setting."""
    if powersgd_rank < 1:
        raise ConfigurationError(f"powersgd_rank={powersgd_rank} must be >= 1 (--trainer.strategy.powersgd_rank).")
    if powersgd_warmup_steps < 2:
        raise ConfigurationError(
            f"powersgd_warmup_steps={powersgd_warmup_steps} must be >= 2: PowerSGD's error feedback starts after "
            "plain all-reduce steps (--trainer.strategy.powersgd_warmup_steps)."
        )


def compression_hook(
    compression: str, backend: str, powersgd_rank: int = 1, powersgd_warmup_steps: int = 1000
) -> CompressionHook | None:
    """The hook for ``compression`` on ``backend`` (``None`` for ``none``).

    Raises ``ValueError`` naming the fix for an unknown name or PowerSGD settings it would reject.
    """
    if compression not in COMPRESSIONS:
        raise ConfigurationError(f"grad_compression={compression!r} is not one of {list(COMPRESSIONS)}.")
    if compression == "none":
        return None
    if compression == "fp16":
        return CompressionHook(state=None, hook=default_hooks.fp16_compress_hook)  # state None: the default group
    if compression == "bf16":
        return CompressionHook(state=None, hook=default_hooks.bf16_compress_hook if backend == "nccl" else bf16_hook)
    check_powersgd_settings(powersgd_rank, powersgd_warmup_steps)
    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=powersgd_warmup_steps
    )
    powersgd = PowerSGDHook(state)
    return CompressionHook(state=state, hook=powersgd.hook, powersgd=powersgd)
