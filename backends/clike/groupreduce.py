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
Only plain register types (no bool, no float16), a leaf block of one load and one store (and the
constant stores of ``written`` masks, done by work-item 0), no constraints, at least ``MIN_LANES``
lanes, and an output access giving each output point its own element (each dim a constant or one
output index of coefficient 1) are taken; else None. A combine in ``split_reduction``'s
``self_initialised`` form (an outer block over the output points: a local accumulator filled with
the identity, an inner block over the lanes aggregating into it, its value stored) is taken too:
the lanes' accesses are the outer view's plus the inner one's, and work-item 0 assigns the result
(the output held nothing to aggregate with).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from backends.clike.ops import binary
from backends.clike.target import CTarget
from stripe.ir import Block, Constant, Index, Load, RefDir, Refinement, Special, Store
from stripe.specials import fill_name
from tile.affine import Affine
from tile.dtypes import DType

MAX_GROUP = 256  # work-items per output point: within every OpenCL GPU's work-group limit
MIN_LANES = 128  # fewer: the general loop is as fast (H100: 4096 outputs x 32 lanes, 4 us; a tree 7)
AGGS = ("add", "mul", "max", "min")


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


def match(block: Block, buffers: tuple[str, ...], t: CTarget) -> Combine | None:
    """The combine of the module docstring's form, or None."""
    if not t.workgroups or "split_combine" not in block.tags:
        return None
    if block.constraints or len(block.stmts) < 2:
        return None
    if isinstance(block.stmts[0], Special):
        return _self_initialised(block, buffers, t)
    load, store = block.stmts[:2]
    if not (isinstance(load, Load) and isinstance(store, Store) and store.from_ == load.into):
        return None
    refs = {r.into: r for r in block.refs}
    src, dst = refs.get(load.from_), refs.get(store.into)
    marks = _marks(block.stmts[2:], refs, buffers)
    if marks is None or len(block.refs) != 2 + len(marks):
        return None
    if src is None or dst is None or src.dir is not RefDir.IN or dst.agg_op not in AGGS:
        return None
    if dst.dir not in (RefDir.OUT, RefDir.INOUT) or not {src.source, dst.source} <= set(buffers):
        return None
    dt = dst.shape.dtype
    if src.shape.dtype is not dt or dt in (DType.BOOL, DType.FLOAT16) or t.mem(dt) != t.reg(dt):
        return None
    if any(ix.affine is not None and not ix.affine.is_constant for ix in block.idxs):
        return None
    outs = _owned(dst, block.idxs)
    if outs is None:
        return None
    if any(not set(_vars(r)) <= outs for r, _ in marks):
        return None
    lanes = tuple(ix for ix in block.idxs if ix.name not in outs)
    got = Combine(src, dst, tuple(ix for ix in block.idxs if ix.name in outs), lanes, dt, tuple(marks))
    return got if got.lane_count >= MIN_LANES else None


def _self_initialised(block: Block, buffers: tuple[str, ...], t: CTarget) -> Combine | None:
    """A combine in ``split_reduction.self_initialised`` form: ``a = identity; inner block over the
    lanes aggregating P into a; O = a`` (every outer index owned). The lanes' accesses are the outer
    view's plus the inner one's; the result is assigned to ``O``."""
    if len(block.stmts) != 4:
        return None
    fill, inner, load, store = block.stmts
    refs = {r.into: r for r in block.refs}
    if not (isinstance(fill, Special) and isinstance(inner, Block) and isinstance(load, Load)):
        return None
    if not isinstance(store, Store) or store.from_ != load.into or fill.inputs or len(fill.outputs) != 1:
        return None
    local, dst = refs.get(load.from_), refs.get(store.into)
    if local is None or dst is None or local.into != fill.outputs[0] or local.dir is not RefDir.NONE:
        return None
    if local.from_ is not None or dst.dir is not RefDir.OUT or dst.agg_op not in ("", "assign"):
        return None
    if inner.constraints or len(inner.refs) != 2 or len(inner.stmts) != 2:
        return None
    if any(ix.affine is not None for ix in (*block.idxs, *inner.idxs)):
        return None
    iload, istore = inner.stmts
    irefs = {r.into: r for r in inner.refs}
    if not (isinstance(iload, Load) and isinstance(istore, Store) and istore.from_ == iload.into):
        return None
    part, acc = irefs.get(iload.from_), irefs.get(istore.into)
    if part is None or acc is None or acc.source != local.into or acc.agg_op not in AGGS:
        return None
    fn = fill_name(acc.agg_op)
    src = refs.get(part.source)
    if fill.name != fn or src is None or src.dir is not RefDir.IN or part.dir is not RefDir.IN:
        return None
    if not {src.source, dst.source} <= set(buffers) or len(block.refs) != 3:
        return None
    if [d.stride for d in part.shape.dims] != [d.stride for d in src.shape.dims]:
        return None
    dt = dst.shape.dtype
    if {src.shape.dtype, part.shape.dtype, local.shape.dtype, acc.shape.dtype} != {dt}:
        return None
    if dt in (DType.BOOL, DType.FLOAT16) or t.mem(dt) != t.reg(dt):
        return None
    outs = _owned(dst, block.idxs)
    if outs is None or outs != {ix.name for ix in block.idxs}:
        return None
    whole = replace(src, access=tuple(a + b for a, b in zip(src.access, part.access, strict=True)))
    got = Combine(whole, replace(dst, agg_op=acc.agg_op), block.idxs, inner.idxs, dt, (), True)
    return got if got.lane_count >= MIN_LANES else None


def _marks(stmts, refs: dict[str, Refinement], buffers: tuple[str, ...]):
    """``(refinement, constant)`` of each ``c = constant; O2 = store(c)`` pair (the ``written``
    masks ``split_reduction`` moves to its combine), or None for any other statement."""
    if len(stmts) % 2:
        return None
    out = []
    for const, store in zip(stmts[::2], stmts[1::2]):
        if not (isinstance(const, Constant) and isinstance(store, Store) and store.from_ == const.into):
            return None
        r = refs.get(store.into)
        if r is None or r.dir is not RefDir.OUT or r.agg_op not in ("", "assign") or r.source not in buffers:
            return None
        if r.shape.dtype is not const.dtype or const.dtype in (DType.FLOAT16,):
            return None
        out.append((r, const))
    return out


def _vars(r: Refinement) -> list[str]:
    return [v for a in r.access for v in a.vars]


def _owned(dst: Refinement, idxs: tuple[Index, ...]) -> set[str] | None:
    """The output indexes when each dim of ``dst`` is a constant or one of them (coefficient 1,
    each in one dim only: every output point its own element), else None."""
    seen: set[str] = set()
    for a in dst.access:
        names = list(a.vars)
        if not names:
            continue
        if len(names) != 1 or a.coeff(names[0]) != 1 or names[0] in seen:
            return None
        seen.add(names[0])
    return seen if seen <= {ix.name for ix in idxs} else None


def emit(t: CTarget, c: Combine, symbol: str, params: list[tuple[str, DType]], ptrs: dict[str, str]):
    """The kernel text, its work-items and its work-group size."""
    T, W, L = t.reg(c.dtype), c.group, c.lane_count
    op = c.dst.agg_op
    lines = [f"__local {T} red[{W}];", "const long lid = (long)get_local_id(0);"]
    lines.append("const long grp = (long)get_group_id(0);")
    vals = _decode(lines, "grp", c.outs, "o_")
    src = ptrs[c.src.source]
    first = _decode(lines, "lid", c.lanes, "f_")  # lid < W <= L: every work-item has a first lane
    lines.append(f"{T} acc = {src}[{_offset(c.src, {**vals, **first})}];")
    lines.append(f"for (long l = lid + {W}; l < {L}; l += {W}) {{")
    body: list[str] = []
    lanes = _decode(body, "l", c.lanes, "l_")
    body.append(f"const {T} x = {src}[{_offset(c.src, {**vals, **lanes})}];")
    body.append(f"acc = {binary(t, op, 'acc', 'x', c.dtype)};")
    lines += ["    " + b for b in body] + ["}", "red[lid] = acc;", "barrier(CLK_LOCAL_MEM_FENCE);"]
    lines.append(f"for (long s = {W // 2}; s > 0; s >>= 1) {{")
    lines.append("    if (lid < s) {")
    lines.append(f"        const {T} a = red[lid];")
    lines.append(f"        const {T} b = red[lid + s];")
    lines.append(f"        red[lid] = {binary(t, op, 'a', 'b', c.dtype)};")
    lines += ["    }", "    barrier(CLK_LOCAL_MEM_FENCE);", "}"]
    out = f"{ptrs[c.dst.source]}[{_offset(c.dst, vals)}]"
    if c.assign:
        lines += ["if (lid == 0) {", f"    {out} = red[0];"]
    else:
        lines += ["if (lid == 0) {", f"    const {T} cur = {out};", f"    const {T} got = red[0];"]
        lines.append(f"    {out} = {binary(t, op, 'cur', 'got', c.dtype)};")
    for r, const in c.marks:
        value = t.literal(const.value, const.dtype)
        lines.append("    " + t.store(ptrs[r.source], _offset(r, vals), value, const.dtype))
    lines.append("}")
    args = ", ".join(f"__global {t.mem(dt)}* restrict {p}" for p, dt in params)
    head = [f"__kernel __attribute__((reqd_work_group_size({W}, 1, 1)))", f"void {symbol}({args})", "{"]
    groups = 1
    for ix in c.outs:
        groups *= ix.range
    return "\n".join(head + ["    " + ln for ln in lines] + ["}"]), groups * W, W


def _decode(lines: list[str], var: str, idxs: tuple[Index, ...], prefix: str) -> dict[str, str]:
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


def _offset(r: Refinement, vals: dict[str, str]) -> str:
    """The element offset of ``r`` at the point ``vals`` (a kernel's refinement: its dims' strides
    are the buffer's)."""
    total = Affine()
    for a, d in zip(r.access, r.shape.dims):
        total = total + a * d.stride
    terms = [vals[n] if total.coeff(n) == 1 else f"{vals[n]} * {int(total.coeff(n))}" for n in total.vars]
    if total.const:
        terms.append(str(int(total.const)))
    return " + ".join(terms) or "0"
