"""Products by constant weights written panel by panel (the backend's import, ``pack``).

A compiled CPU product copies its weight into contiguous panels (``NV * W`` columns, the reduction
points row-major) on every call (``backends/llvm/packing.py``); onnxruntime packs constant weights
once, at session creation. Here the importer does the same: a ``Gemm`` by a constant float32 weight
``[K, N]`` (N a multiple of ``PANEL``) stores it as ``[N / PANEL, K, PANEL]`` and writes its result
panel-major, ``Y3[p, i, q] = +(A[i, k] * Wp[p, k, q])`` (the micro-kernel reads ``Wp`` where it
is: ``Packing.in_place``). Beside it, the row-major ``[M, N]`` value is a permute and reshape of
``Y3`` (``from_panels``): written only where something reads it, since a unary activation is
computed on the panels (``ops_elementwise.unary``) and a ``Gemm`` reading them sums over
``k = PANEL*k0 + k1`` of ``Y3[k0, i, k1]``. Each element receives the same terms in the same order:
the values are those of the row-major product.
"""

from __future__ import annotations

import numpy as np

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import permute, reshape

# columns of a panel: the LLVM CPU micro-kernel's for float32 with 512-bit vectors (4 x 16 lanes);
# with narrower vectors the panels are still correct, only packed again (``Packing.in_place``)
PANEL = 64


def panel_of(ctx: Context, v: Value) -> Value | None:
    """The panel-major ``[P, M, PANEL]`` tensor holding ``[M, N]`` ``v``'s values, where recorded."""
    return ctx.b.panels.get(v.name) if v.name is not None else None


def from_panels(ctx: Context, y3: Value, hint: str) -> Value:
    """Panel-major ``y3`` as its row-major ``[M, P * PANEL]`` value, recorded as having ``y3``
    beside it (the copy is left out of the program where nothing reads it)."""
    p, m, w = y3.shape
    out = reshape(ctx, permute(ctx, y3, [1, 0, 2], hint), (m, p * w))
    ctx.b.panels[out.name] = y3
    return out


def panel_weight(ctx: Context, w: np.ndarray, dtype: DType, bias: Value | None) -> bool:
    """Whether a ``Gemm`` by the constant K-major weight ``w`` (``[K, N]``) is written panel by
    panel: float32, N a whole number of panels (more than one), a bias absent or a constant of N."""
    k, n = w.shape
    if dtype is not DType.FLOAT32 or n % PANEL or n < 2 * PANEL:
        return False
    return bias is None or (bias.const is not None and bias.const.size == n and bias.rank <= 2)


def panel_gemm(ctx: Context, a: Value, w: np.ndarray, bias: Value | None, name: str) -> Value:
    """``a @ w + bias`` (``w`` a constant ``[K, N]``, ``panel_weight``) as a panel-major product,
    returned as its row-major value (``from_panels``); ``a`` read from its own panels where it has
    them."""
    k, n = w.shape
    p = n // PANEL
    wp = ctx.b.materialize(ctx.folded(np.ascontiguousarray(w.reshape(k, p, PANEL).transpose(1, 0, 2)),
                                      DType.FLOAT32), f"{name}_panels")
    a_read, k_at = a_panels(ctx, a)
    y3 = ctx.emit(f"$[p, i, q: {p}, {a.shape[0]}, {PANEL}] = +({a_read} * {wp}[p, {k_at}, q])", "Gemm")
    if bias is not None:
        c = ctx.b.materialize(ctx.folded(bias.const.reshape(p, 1, PANEL), DType.FLOAT32), f"{name}_bias")
        y3 = ctx.let(f"{y3} + {c}", "Gemm")
    return from_panels(ctx, y3, "Gemm")


def a_panels(ctx: Context, a: Value) -> tuple[str, str]:
    """The read of ``[M, K]`` ``a`` at ``[i, k]`` in a product, and the expression of ``k`` for
    the other operand: from ``a``'s panels where it has them (``k = PANEL*k0 + k1``)."""
    a3 = panel_of(ctx, a)
    if a3 is None:
        return f"{a}[i, k]", "k"
    return f"{a3}[k0, i, k1]", f"{PANEL}*k0 + k1"


__all__ = ["PANEL", "a_panels", "from_panels", "panel_gemm", "panel_of", "panel_weight"]
