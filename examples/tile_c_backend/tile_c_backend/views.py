"""What a refinement denotes at one point of its block: a buffer, an offset and (size, stride)s."""

from __future__ import annotations

from dataclasses import dataclass

from stripe.ir import Dim
from tile.dtypes import DType

from tile_c_backend import cexpr


@dataclass(frozen=True)
class View:
    """A refinement at the current point: ``buf[off + sum(k_d * dims[d].stride)]`` for the
    element ``k``; ``dtype`` is the refinement's, ``buf_dtype`` its buffer's."""

    name: str  # the Stripe name (for messages)
    buf: str  # C pointer to the buffer's first element
    buf_dtype: DType
    off: str  # C expression of the base element's offset
    dims: tuple[Dim, ...]
    dtype: DType
    agg_op: str

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d.size
        return n

    def at(self, flat: str) -> str:
        """The C lvalue of the view's element number ``flat`` (row-major, a C int64 expression)."""
        offset = element_offset(self.dims, flat)
        return f"{self.buf}[{self.off}]" if offset == "0" else f"{self.buf}[{self.off} + {offset}]"

    def load(self, flat: str = "0") -> str:
        """Element ``flat`` as a ``ctype(dtype)`` value (float16 read as float)."""
        raw = self.at(flat)
        if self.buf_dtype is DType.FLOAT16:
            raw = f"(float){raw}"
        return cexpr.convert(raw, self.buf_dtype, self.dtype)

    def store(self, flat: str, expr: str, dt: DType) -> str:
        """The C statement writing ``expr`` (a ``ctype(dt)``) to element ``flat``, converted to the
        refinement's type and then to the buffer's."""
        value = cexpr.convert(cexpr.convert(expr, dt, self.dtype), self.dtype, self.buf_dtype)
        return f"{self.at(flat)} = {value};"


def element_offset(dims: tuple[Dim, ...], flat: str) -> str:
    """The buffer offset (relative to the base) of row-major element ``flat`` of a view."""
    inner, n = [], 1
    for d in reversed(dims):
        inner.append(n)
        n *= d.size
    inner.reverse()
    if n == 0 or all(d.size == 1 for d in dims):
        return "0"
    if all(d.stride == step or d.size == 1 for d, step in zip(dims, inner)):
        return flat  # dense: the element's number is its offset
    terms = []
    for d, step in zip(dims, inner):
        if d.size == 1 or d.stride == 0:
            continue
        digit = flat if step == 1 else f"({flat} / {step})"
        if step * d.size != n:
            digit = f"({digit} % {d.size})"
        terms.append(f"{digit} * {d.stride}")
    return " + ".join(terms) if terms else "0"
