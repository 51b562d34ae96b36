"""Work-group tree reductions for ``split_reduction``'s combine blocks, on targets with work-groups.

A combine block is ``O[out] = agg over lanes of P[out, lanes]`` (``+ * > <``). The general kernel
runs it as one work-item per output point looping over every lane, which leaves a GPU idle where
the outputs are few: a global sum's last combine is one work-item reading thousands of partials
one after another. A combine the config marks (``combine_set: ["split_combine"]``; a long combine
split again keeps the mark on both its parts) runs here instead as one work-group of ``W``
work-items per output point, ``W`` the largest power of two at most ``min(lanes, MAX_GROUP)``:
work-item ``w`` aggregates lanes ``w, w + W, ...`` in a register (adjacent work-items read
adjacent lanes), the ``W`` values meet in a tree in ``__local`` memory, and work-item 0 aggregates
the result into ``O`` as any kernel's store does (``O`` holds the aggregation's start). The lanes
are regrouped: the reordering ``split_reduction`` already declares (strict mode runs neither).
What the block is comes from its ``CombinePlan`` (``split_reduction`` attaches it to the marked
blocks of the two forms a tree runs, ``stripe.passes.combine_plans``): the lanes, the aggregation,
the refinements read and written, and whether the block is in the ``self_initialised`` form (an
outer block over the output points: a local accumulator filled with the identity, an inner block
over the lanes aggregating into it, its value stored; the lanes' accesses are the outer view's
plus the inner one's, and work-item 0 assigns the result). Nothing here recognises the block's
shape; ``takes`` keeps the target's own refusals (plain register types: no bool, no float16; the
kernel's buffers; at least ``MIN_LANES`` lanes), and the general kernel runs a refused block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from backends.clike.ops import binary
from backends.clike.target import CTarget
from stripe.ir import Block, Constant, Index, Refinement
from stripe.plans import CombinePlan
from tile.affine import Affine
from tile.dtypes import DType

MAX_GROUP = 256  # work-items per output point: within every OpenCL GPU's work-group limit
MIN_LANES = 128  # fewer: the general loop is as fast (measured; bench/RESULTS.md)


@dataclass(frozen=True)
class Combine:
    """A matched combine block: its input and output refinements, output and lane indexes."""

    src: Refinement
    dst: Refinement
    outs: tuple[Index, ...]
    lanes: tuple[Index, ...]
    dtype: DType
    marks: tuple[tuple[Refinement, Constant], ...] = ()  # other outputs storing a constant
    assign: bool = False  # the block starts from the identity itself: the result is assigned

    @property
    def lane_count(self) -> int:
        n = 1
        for ix in self.lanes:
            n *= ix.range
        return n

    @property
    def group(self) -> int:
        n = min(self.lane_count, MAX_GROUP)
        return 1 << (n.bit_length() - 1)


def takes(block: Block, buffers: tuple[str, ...], t: CTarget, min_lanes: int = MIN_LANES) -> Combine | None:
    """The combine ``block``'s ``CombinePlan`` declares, when this target runs it as a tree: it has
    work-groups, the combine reads and writes the kernel's buffers in a plain register type (no
    bool, no float16; no float16 mask either), over at least ``min_lanes`` lanes; else None."""
    plan = block.plan
    if not t.workgroups or not isinstance(plan, CombinePlan):
        return None
    c = _self_initialised(block, plan) if plan.self_init else _plain(block, plan)
    dt = c.dtype
    if not {c.src.source, c.dst.source, *(r.source for r, _ in c.marks)} <= set(buffers):
        return None
    if dt in (DType.BOOL, DType.FLOAT16) or t.mem(dt) != t.reg(dt):
        return None
    if any(k.dtype is DType.FLOAT16 for _, k in c.marks):
        return None
    return c if c.lane_count >= min_lanes else None


def _plain(block: Block, plan: CombinePlan) -> Combine:
    """``O[outs] = agg over lanes of P[outs, lanes]``, then the constant stores of the masks."""
    lanes = {v for v, _ in plan.lanes}
    marks = tuple((block.ref(st.into), k) for k, st in zip(block.stmts[2::2], block.stmts[3::2]))
    dst = block.ref(plan.out)
    outs = tuple(ix for ix in block.idxs if ix.name not in lanes)
    got = tuple(ix for ix in block.idxs if ix.name in lanes)
    return Combine(block.ref(plan.src), dst, outs, got, dst.shape.dtype, marks)


def _self_initialised(block: Block, plan: CombinePlan) -> Combine:
    """An outer block over the output points, its inner block over the lanes: the lanes' accesses
    are the outer view's plus the inner one's; the result is assigned to ``O``."""
    inner = block.stmts[1]
    part = inner.ref(inner.stmts[0].from_)
    src = block.ref(plan.src)
    whole = replace(src, access=tuple(a + b for a, b in zip(src.access, part.access, strict=True)))
    dst = block.ref(plan.out)
    return Combine(whole, replace(dst, agg_op=plan.agg), block.idxs, inner.idxs, dst.shape.dtype, (), True)


def emit(t: CTarget, c: Combine, symbol: str, params: list[tuple[str, DType]], ptrs: dict[str, str]):
    """The kernel text, its work-items and its work-group size."""
    T, W, L = t.reg(c.dtype), c.group, c.lane_count
    op = c.dst.agg_op
    lines = [f"__local {T} red[{W}];", "const long lid = (long)get_local_id(0);"]
    lines.append("const long grp = (long)get_group_id(0);")
    vals = decode(lines, "grp", c.outs, "o_")
    src = ptrs[c.src.source]
    first = decode(lines, "lid", c.lanes, "f_")  # lid < W <= L: every work-item has a first lane
    lines.append(f"{T} acc = {src}[{offset(c.src, {**vals, **first})}];")
    lines.append(f"for (long l = lid + {W}; l < {L}; l += {W}) {{")
    body: list[str] = []
    lanes = decode(body, "l", c.lanes, "l_")
    body.append(f"const {T} x = {src}[{offset(c.src, {**vals, **lanes})}];")
    body.append(f"acc = {binary(t, op, 'acc', 'x', c.dtype)};")
    lines += ["    " + b for b in body] + ["}", "red[lid] = acc;", "barrier(CLK_LOCAL_MEM_FENCE);"]
    lines += tree(t, c, W)
    lines += result(t, c, ptrs, vals, "red[0]")
    groups = 1
    for ix in c.outs:
        groups *= ix.range
    return t.group_kernel(symbol, params, W, ["    " + ln for ln in lines]), groups * W, W


def tree(t: CTarget, c: Combine, W: int, count: int | str | None = None) -> list[str]:
    """The lines aggregating ``red[0..W)`` (``count``, a number or an expression: only its first
    ``count`` values, the rest left out) into ``red[0]``, pairs ``s`` apart for ``s = W/2 ... 1``;
    every work-item runs them."""
    T, op = t.reg(c.dtype), c.dst.agg_op
    full = count is None or (isinstance(count, int) and count >= W)
    cond = "lid < s" if full else f"lid < s && lid + s < {count}"
    return [
        f"for (long s = {W // 2}; s > 0; s >>= 1) {{",
        f"    if ({cond}) {{",
        f"        const {T} a = red[lid];",
        f"        const {T} b = red[lid + s];",
        f"        red[lid] = {binary(t, op, 'a', 'b', c.dtype)};",
        "    }",
        "    barrier(CLK_LOCAL_MEM_FENCE);",
        "}",
    ]


def result(t: CTarget, c: Combine, ptrs: dict[str, str], vals: dict[str, str], value: str) -> list[str]:
    """Work-item 0's store of the combined ``value`` into ``O`` at the output point ``vals``
    (assigned when the block starts from the identity itself, else aggregated into what ``O``
    holds), then the masks' constants."""
    T, op = t.reg(c.dtype), c.dst.agg_op
    out = f"{ptrs[c.dst.source]}[{offset(c.dst, vals)}]"
    if c.assign:
        lines = ["if (lid == 0) {", f"    {out} = {value};"]
    else:
        lines = ["if (lid == 0) {", f"    const {T} cur = {out};", f"    const {T} got = {value};"]
        lines.append(f"    {out} = {binary(t, op, 'cur', 'got', c.dtype)};")
    for r, const in c.marks:
        literal = t.literal(const.value, const.dtype)
        lines.append("    " + t.store(ptrs[r.source], offset(r, vals), literal, const.dtype))
    return [*lines, "}"]


def decode(lines: list[str], var: str, idxs: tuple[Index, ...], prefix: str) -> dict[str, str]:
    """Declares each index's value from the flat number ``var`` (row-major: the last fastest)."""
    vals: dict[str, str] = {}
    inner = 1
    for ix in reversed(idxs):
        name = prefix + re.sub(r"[^A-Za-z0-9_]", "_", ix.name)
        expr = var if inner == 1 else f"({var} / {inner})"
        if ix is not idxs[0]:
            expr = f"{expr} % {ix.range}"
        start = int(ix.affine.const) if ix.affine is not None else 0
        lines.append(f"const long {name} = {expr}{f' + {start}' if start else ''};")
        vals[ix.name] = name
        inner *= ix.range
    return vals


def offset(r: Refinement, vals: dict[str, str]) -> str:
    """The element offset of ``r`` at the point ``vals`` (a kernel's refinement: its dims' strides
    are the buffer's)."""
    total = Affine()
    for a, d in zip(r.access, r.shape.dims):
        total = total + a * d.stride
    terms = [vals[n] if total.coeff(n) == 1 else f"{vals[n]} * {int(total.coeff(n))}" for n in total.vars]
    if total.const:
        terms.append(str(int(total.const)))
    return " + ".join(terms) or "0"
