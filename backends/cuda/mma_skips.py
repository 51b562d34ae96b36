"""Skipped points of a tensor-core kernel (``backends.cuda.mma``): a padded convolution's input.

The interpreter never combines a point that a constraint skips. A guard on operand A's own M
indexes (the input of a convolution padded at its borders) skips such points; the kernel loads
a zero there, and the unit multiplies every point, so a skipped point adds ``0 x b``: nothing,
unless ``b`` is infinite or NaN. As in the SIMT kernel (``backends.clike.tiled``), the kernel
therefore

* stages, beside A's K step, one flag per copied chunk of A (the ``w`` elements of one load
  share their guards): whether the guards keep it (``Am``);
* has each work-item look at the B elements it copied into the step (``B`` is never skipped: on
  the unit only A may carry such guards) and note the step when one is infinite or NaN
  (``nonfinite[buf] = ks``; writers of one step write the same value, and a stale entry names an
  older step);
* multiplies such a step (the same for the whole work-group, after the barrier) in a plain loop:
  each lane adds, for each of its accumulator elements, the products of the points A's flags
  keep, in float32 (TF32 modes too: more accurate than the unit, within their tolerance). Other
  steps take the unit, where a skipped point adds ``0 x finite``, which changes no sum.
"""

from __future__ import annotations

from tile.dtypes import DType

# the exponent bits of each operand type: all set is an infinity or a NaN
_EXPONENT = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000}


def declare(em, stages: int, sa: int, aw: int) -> None:
    """The flags of A's chunks and the steps holding a non-finite B value, reset before the loop."""
    em.line(f"__local uchar Am[{stages * sa // aw}];")
    em.line(f"__local int nonfinite[{stages}];")
    em.line(f"if (lid < {stages}) nonfinite[lid] = -1;")
    em.line("barrier(CLK_LOCAL_MEM_FENCE);")


def flag(em, p: str, at: str, w: int, depth: int) -> None:
    """A's chunk ``p`` at ``__local`` position ``at`` kept (``{p}_in``) or skipped."""
    em.line(f"Am[({at}) / {w}] = {p}_in;", depth)


def note_nonfinite(em, value: str, w: int, depth: int) -> None:
    """``nonfinite[buf] = ks`` when one of the ``w`` B values in ``value`` is infinite or NaN."""
    mask = _EXPONENT[em.g.dtype.value]
    em.line(f"{{ const {em.U}{w if w > 1 else ''} nv = {value};", depth)
    parts = [f"nv.s{c:x}" for c in range(w)] if w > 1 else ["nv"]
    bad = " || ".join(f"((nv{p[2:]} & {mask:#x}) == {mask:#x})" for p in parts)
    em.line(f"if ({bad}) nonfinite[buf] = ks; }}", depth + 1)


def note_nonfinite_sums(em, sums: list[str], depth: int) -> None:
    """``tainted`` when one of the float32 ``sums`` is infinite or NaN: a skipped point's ``0 x b``
    with ``b`` infinite or NaN makes a sum NaN, which no later addition undoes (the warp-group
    kernel, ``backends.cuda.wgmma``, then sums the tile again; a sum infinite or NaN on its own
    comes out the same)."""
    mask = _EXPONENT["float32"]
    em.line("{ uint bad = 0;", depth)
    for v in sums:
        em.line(f"bad |= (as_uint({v}) & {mask:#x}) == {mask:#x};", depth + 1)
    em.line("if (bad) tainted = 1; }", depth + 1)


def _value(em, arr: str, index: str) -> str:
    """The float value of element ``index`` of a staged tile (raw bits in ``__local``)."""
    dt = em.g.dtype
    if dt is DType.FLOAT16:
        return f"vload_half({index}, (__local const half*){arr})"
    if dt.value == "bfloat16":
        return f"as_float(((uint){arr}[{index}]) << 16)"
    return f"as_float({arr}[{index}])"


def slow_step(em, sa: int, sb: int, fm: int, fn: int, aw: int, depth: int) -> None:
    """One K step without the unit, A's skipped points left out (module docstring)."""
    op, tl = em.op, em.tl
    frag = op.c
    mrow, ncol = em.lane_part(frag.rows), em.lane_part(frag.cols)
    rows = sorted({(i, r) for i in range(fm) for r, _ in frag.elements})
    cols = sorted({(j, c) for j in range(fn) for _, c in frag.elements})
    em.line(f"for (int kq = 0; kq < {tl.kt}; kq++) {{", depth)
    d = depth + 1
    for i, r in rows:
        pos = em.block_pos(f"{i * op.m + r} + {mrow}", "m")
        em.line(f"const int sa{i}_{r} = {em.staged_index('a', pos, 'kq', sa)};", d)
        em.line(f"const bool ka{i}_{r} = Am[sa{i}_{r} / {aw}];", d)
        em.line(f"const float va{i}_{r} = {_value(em, 'As', f'sa{i}_{r}')};", d)
    for j, c in cols:
        pos = em.block_pos(f"{j * op.n + c} + {ncol}", "n")
        em.line(f"const float vb{j}_{c} = {_value(em, 'Bs', em.staged_index('b', pos, 'kq', sb))};", d)
    acc = "s" if em.mode == "3xtf32" else "c"
    for i in range(fm):
        for j in range(fn):
            for e, (r, c) in enumerate(frag.elements):
                em.line(f"if (ka{i}_{r}) {acc}{i}_{j}_{e} = fma(va{i}_{r}, vb{j}_{c}, {acc}{i}_{j}_{e});", d)
    em.line("}", depth)
