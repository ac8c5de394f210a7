"""A checkpoint as two parts: the bytes of its tensors laid out in one buffer, and a small pickle of everything else.

Copying a training state into memory that is already mapped is one ``memcpy`` per tensor; serialising it
(``torch.save``) is much slower. :func:`pack` walks the checkpoint once with a pickler whose persistent ids stand for
the tensors (as ``torch.save`` does), so any container a Lightning checkpoint holds keeps its type and its shared
references; :meth:`Packed.copy_into` then copies every tensor into its place in a buffer, and :func:`unpack` gives the
checkpoint back from the skeleton and tensors holding those bytes, each with a storage of its own (some consumers of
state tensors, e.g. ``torch.Generator.set_state``, crash on a view with an offset into a larger storage).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from typing import Any

import torch

__all__ = [
    "ALIGNMENT",
    "Packed",
    "TensorRef",
    "UnsupportedTensorError",
    "as_bytes",
    "empty_tensors",
    "pack",
    "tensors_from_buffer",
    "unpack",
]

ALIGNMENT = 64
"""Bytes each tensor's offset in the buffer is a multiple of (any dtype can be viewed there)."""


class UnsupportedTensorError(TypeError):
    """The checkpoint holds a tensor whose bytes are not one dense block (sparse, quantized, a tensor subclass that
    shards its data)."""


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes lie in the buffer, and how to view them."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    requires_grad: bool


@dataclasses.dataclass(frozen=True)
class Packed:
    """A checkpoint taken apart: ``skeleton`` (a pickle whose persistent ids index ``refs``), the source ``tensors``
    in the order of ``refs``, and ``nbytes``, the buffer size they need."""

    skeleton: bytes
    tensors: list[torch.Tensor]
    refs: list[TensorRef]
    nbytes: int

    def copy_into(self, buffer: torch.Tensor) -> None:
        """Copy every tensor into its place in ``buffer`` (a flat ``uint8`` tensor of at least ``nbytes``)."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.nbytes:
            raise ValueError(f"copy_into needs a flat uint8 buffer of at least {self.nbytes} bytes")
        for tensor, ref in zip(self.tensors, self.refs, strict=True):
            if ref.nbytes:
                _view(buffer, ref).copy_(tensor.detach())


def pack(obj: Any) -> Packed:
    """Take ``obj`` apart into a skeleton and its tensors (a tensor referred to twice is stored once).

    Raises:
        UnsupportedTensorError: A tensor is not dense and strided (its bytes cannot be copied as one block).

    Examples:
        >>> state = {"w": torch.arange(3.0), "step": 7}
        >>> packed = pack(state)
        >>> buffer = torch.empty(packed.nbytes, dtype=torch.uint8)
        >>> packed.copy_into(buffer)
        >>> unpack(packed.skeleton, packed.refs, tensors_from_buffer(packed.refs, buffer))
        {'w': tensor([0., 1., 2.]), 'step': 7}
    """
    tensors: list[torch.Tensor] = []
    refs: list[TensorRef] = []
    index_of: dict[int, int] = {}
    end = 0

    class _Pickler(pickle.Pickler):
        def persistent_id(self, value: Any) -> Any:
            nonlocal end
            if not isinstance(value, torch.Tensor):
                return None
            if id(value) not in index_of:
                _check_dense(value)
                offset = -(-end // ALIGNMENT) * ALIGNMENT
                nbytes = value.numel() * value.element_size()
                refs.append(TensorRef(offset, nbytes, value.dtype, tuple(value.shape), value.requires_grad))
                tensors.append(value)
                index_of[id(value)] = len(refs) - 1
                end = offset + nbytes
            return index_of[id(value)]

    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return Packed(out.getvalue(), tensors, refs, end)


def unpack(skeleton: bytes, refs: list[TensorRef], tensors: list[torch.Tensor]) -> Any:
    """The object :func:`pack` took apart, holding ``tensors`` (one per ref, with the bytes the ref describes)."""

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, index: Any) -> torch.Tensor:
            tensor = tensors[index]
            return tensor.requires_grad_(True) if refs[index].requires_grad else tensor

    return _Unpickler(io.BytesIO(skeleton)).load()


def empty_tensors(refs: list[TensorRef]) -> list[torch.Tensor]:
    """A new tensor for each ref, to read its bytes into (:func:`as_bytes`)."""
    return [torch.empty(ref.shape, dtype=ref.dtype) for ref in refs]


def tensors_from_buffer(refs: list[TensorRef], buffer: torch.Tensor) -> list[torch.Tensor]:
    """Each ref's tensor, copied out of ``buffer`` into a storage of its own."""
    return [_view(buffer, ref).clone() if ref.nbytes else torch.empty(ref.shape, dtype=ref.dtype) for ref in refs]


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as a flat ``uint8`` view."""
    return tensor.reshape(-1).view(torch.uint8)


def _view(buffer: torch.Tensor, ref: TensorRef) -> torch.Tensor:
    return buffer[ref.offset : ref.offset + ref.nbytes].view(ref.dtype).view(ref.shape)


def _check_dense(tensor: torch.Tensor) -> None:
    if tensor.layout != torch.strided or tensor.is_quantized or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise UnsupportedTensorError(
            f"a {type(tensor).__name__} with layout {tensor.layout} cannot be copied into a memory snapshot as one "
            "block of bytes"
        )
