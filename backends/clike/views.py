"""Views of buffers at a point, and the naming and error helpers the code generator shares."""

from __future__ import annotations

from dataclasses import dataclass

from backends.clike import numbers
from backends.clike.target import CTarget
from stripe.ir import Dim, Shaped
from tile.dtypes import DType


@dataclass(frozen=True)
class View(Shaped):
    """A refinement at the current point: element ``base + Σ k_d * stride_d`` of ``ptr``, a buffer
    holding ``buf_dtype`` (in memory format, or registers when ``local``) seen as ``dtype``."""

    name: str
    ptr: str
    buf_dtype: DType
    base: str
    dims: tuple[Dim, ...]
    dtype: DType
    agg_op: str
    local: bool = False

    def at(self, coords: list[str]) -> str:
        """The offset of the element at ``coords`` (C integer expressions, one per dimension)."""
        terms = [self.base] if self.base != "0" else []
        for c, d in zip(coords, self.dims):
            if not numbers.zero(d.stride) and c != "0":
                terms.append(c if numbers.one(d.stride) else f"{c} * {numbers.text(d.stride)}")
        return " + ".join(terms) or "0"

    def load_raw(self, t: CTarget, off: str) -> str:
        return f"{self.ptr}[{off}]" if self.local else t.load(self.ptr, off, self.buf_dtype)

    def store_raw(self, t: CTarget, off: str, value: str) -> str:
        return (
            f"{self.ptr}[{off}] = {value};" if self.local else t.store(self.ptr, off, value, self.buf_dtype)
        )

    def read(self, t: CTarget, off: str) -> str:
        return t.convert(self.load_raw(t, off), self.buf_dtype, self.dtype)

    def write(self, t: CTarget, off: str, value: str) -> str:
        """The statement overwriting one element with ``value`` (a register of the view's dtype)."""
        return self.store_raw(t, off, t.convert(value, self.dtype, self.buf_dtype))
