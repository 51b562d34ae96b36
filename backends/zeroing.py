"""Which buffers of a program must be zero-filled before every run, so reused buffers are safe.

Stripe gives every buffer of the ``#program`` block zeroed memory (``ref_interp.stripe_exec``),
and the runner reuses a program's buffers from call to call: a buffer still holding the last
call's values must be zeroed again unless the program overwrites all of it before anything reads
it. The lowering already starts every aggregated output with an explicit ``zero`` or
``agg_init_*`` kernel, and elementwise kernels store every element, so most buffers need no fill
of the runner's own; this module proves that, conservatively, per buffer:

* the first kernel of ``#main`` that names the buffer must only write it (``out``, never ``in``);
* and it writes every element before reading any: either a block of whole-view specials (fills,
  copies, reshapes, gathers, scatters, ...) over the whole buffer, or a nest of blocks (one
  statement per level naming the buffer, ending in a plain ``assign`` store, every view keeping the
  buffer's strides) that stores every element, as follows.

The nest is read as one index space: each index of each level (through its index affine, such as
``m_o:1 = m``) is an affine of independent variables, one per index of range > 1, so the store runs
at the points of their box that satisfy every level's constraints. Each dimension's composed access
``Σ coeff·var`` must be a mixed-radix numbering of ``[0, R)`` (coefficients 1, r1, r1·r2, ...) by
variables of its own, so box points and elements of ``R_0 x R_1 x ...`` correspond one to one;
``R`` may exceed the size only where a constraint clips it: ``λ·(k - access_d) >= 0`` with λ > 0
and ``⌊k⌋ = size_d - 1``, keeping exactly the in-bounds points of that dimension. Any other
constraint must hold on the whole box. Then the points that store are one per element (for each
value of any variable no access uses, which only repeats the stores). This is the form of a GPU
GEMM's edge tiles (``tile_gemms`` after ``gemm_outputs``: the fused epilogue stores each ``C``
element once, its tiles clipped where the sizes do not divide), whose output needs no fill.

Anything else (a constraint that cuts off in-bounds elements or mixes dimensions, one that lets
stores fall outside, reinterpreted views, aggregating stores, a buffer no kernel names) is zeroed:
a needless fill costs time, a missing one leaks a previous call's values.
A kernel without indexes whose first statement naming the buffer is such a block covers it too
(``one_kernel``'s partial block nested in its combine). A buffer tagged ``counter`` (a last
work-group's counter, which its kernel leaves at zero) is zeroed once, when allocated
(``zeroed_once``), never per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from stripe.ir import Block, Load, RefDir, Refinement, Special, Store
from stripe.passes.one_kernel import COUNTER
from tile.affine import Affine
from tile.bounds import poly_interval

# Specials that overwrite their whole output view (stripe/specials.py states each rule).
_WHOLE = frozenset(
    {"zero", "copy", "reshape", "shape", "gather", "scatter", "builtin_softmax", "builtin_logsoftmax"}
)


def needs_zero(program: Block, inputs: frozenset[str] | set[str]) -> set[str]:
    """The buffers of ``program`` (its refinements, less ``inputs``, which the host writes whole)
    that the runner must zero-fill before each run."""
    main = program.stmts[0]
    assert isinstance(main, Block)
    sizes = {r.into: r.shape for r in program.refs}
    first_use: dict[str, Block] = {}  # the first kernel naming each buffer, in one walk (not one each)
    for s in main.stmts:
        if isinstance(s, Block):
            for r in s.refs:
                first_use.setdefault(r.source, s)
    out = set()
    for name, shape in sizes.items():
        if name in inputs or shape.elements == 0 or COUNTER in program.ref(name).tags:
            continue
        first = first_use.get(name)
        if first is None or not _covers(first, name, tuple(d.size for d in shape.dims),
                                        tuple(d.stride for d in shape.dims)):
            out.add(name)
    return out


def zeroed_once(program: Block) -> set[str]:
    """The buffers of ``program`` tagged ``counter``: the kernel that uses one leaves it at zero
    (a last work-group's counter, ``backends.clike.lastgroup``), so the runner zeroes it once, when
    it allocates it, and never again."""
    return {r.into for r in program.refs if COUNTER in r.tags}


def _names(block: Block, name: str) -> list[Refinement]:
    return [r for r in block.refs if r.source == name]


def _covers(kernel: Block, name: str, sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    refs = _names(kernel, name)
    if len(refs) == 1 and _first_block_covers(kernel, refs[0], sizes, strides):
        return True
    if len(refs) != 1 or refs[0].dir is not RefDir.OUT:
        return False
    ref = refs[0]
    if _special_fill(kernel, ref, sizes):
        return True
    nest = _Nest([Affine()] * len(sizes), [], {})
    return _collect(kernel, ref, strides, nest, {}) and _numbers(nest, sizes)


def _first_block_covers(
    kernel: Block, ref: Refinement, sizes: tuple[int, ...], strides: tuple[int, ...]
) -> bool:
    """A kernel without indexes that views the whole buffer and whose first statement naming it
    is a block writing all of it (a partial block nested in its combine: ``one_kernel``)."""
    if kernel.idxs or kernel.constraints or tuple(d.size for d in ref.shape.dims) != sizes:
        return False
    if any(not (a.is_constant and a.const == 0) for a in ref.access):
        return False
    first = next((s for s in kernel.stmts if _touches(s, ref.into)), None)
    return isinstance(first, Block) and _covers(first, ref.into, sizes, strides)


def _touches(s, name: str) -> bool:
    return (
        (isinstance(s, Store) and s.into == name)
        or (isinstance(s, Load) and s.from_ == name)
        or (isinstance(s, Special) and name in (*s.inputs, *s.outputs))
        or (isinstance(s, Block) and bool(_names(s, name)))
    )


def _special_fill(kernel: Block, ref: Refinement, sizes: tuple[int, ...]) -> bool:
    """A kernel of whole-view specials, one of which writes ``ref``, which is the whole buffer."""
    if kernel.constraints or any(i.range != 1 for i in kernel.idxs) or not kernel.stmts:
        return False
    if not all(isinstance(s, Special) for s in kernel.stmts):
        return False
    whole = tuple(d.size for d in ref.shape.dims) == sizes and all(
        a.is_constant and a.const == 0 for a in ref.access
    )
    writers = [s for s in kernel.stmts if ref.into in s.outputs]  # type: ignore[union-attr]
    readers = [s for s in kernel.stmts if ref.into in s.inputs]  # type: ignore[union-attr]
    return (
        whole
        and not readers
        and bool(writers)
        and all(s.name in _WHOLE or s.name.startswith("agg_init_") for s in writers)  # type: ignore[union-attr]
    )


@dataclass
class _Nest:
    """A store nest composed into one index space: each index of each level is an affine of
    fresh variables ``v`` (each over ``[0, ranges[v])``, independent: the nest runs every level's
    whole range at every point of its parent), so the store runs at the points of that box which
    satisfy ``constraints`` and writes the element ``access`` (one affine per dimension)."""

    access: list[Affine]
    constraints: list[Affine]
    ranges: dict[str, int]


def _collect(block: Block, ref: Refinement, strides: tuple[int, ...], nest: _Nest,
             outer: dict[str, Affine]) -> bool:
    """Add ``block``'s level to ``nest`` (``outer``: the parent's indexes as affines of the nest's
    variables); False where the nest is not one this module can reason about."""
    if len(ref.access) != len(strides) or tuple(d.stride for d in ref.shape.dims) != strides:
        return False  # a view that reinterprets the buffer's layout
    if ref.agg_op not in ("", "assign"):
        return False
    env: dict[str, Affine] = {}
    for ix in block.idxs:
        if ix.range < 1:
            return False  # no points: nothing written
        start = _composed(ix.affine, outer) if ix.affine is not None else Affine()
        if start is None:
            return False
        if ix.range > 1:  # the index runs over [start, start + range)
            var = f"{len(nest.ranges)}:{ix.name}"
            nest.ranges[var] = ix.range
            start = start + Affine.var(var)
        env[ix.name] = start
    for d, poly in enumerate(ref.access):
        a = _composed(poly, env)
        if a is None:
            return False
        nest.access[d] = nest.access[d] + a
    for c in block.constraints:
        a = _composed(c, env)
        if a is None:
            return False
        nest.constraints.append(a)
    touching = [s for s in block.stmts if _touches(s, ref.into)]
    if len(touching) != 1:
        return False
    s = touching[0]
    if isinstance(s, Store):
        return True
    if isinstance(s, Block):
        inner = _names(s, ref.into)
        if len(inner) != 1 or inner[0].dir is not RefDir.OUT:
            return False
        return _collect(s, inner[0], strides, nest, env)
    return False


def _composed(poly: Affine, env: dict[str, Affine]) -> Affine | None:
    """``poly`` over the nest's variables, or None where it names an index ``env`` lacks."""
    return poly.substitute(env) if all(v in env for v in poly.vars) else None


def _numbers(nest: _Nest, sizes: tuple[int, ...]) -> bool:
    """The store writes every element of ``sizes`` exactly once, and nothing outside them.

    Each dimension's access must be a mixed-radix numbering of ``[0, R)`` (``_radix``) by
    variables no other dimension uses, so the box's points and the elements of the padded extent
    ``R_0 x R_1 x ...`` correspond one to one. A constraint must then either hold on the whole box
    (its least value there is at least 0) or be a clip ``λ·(k - access_d) >= 0`` (λ > 0) with
    ``⌊k⌋ = size_d - 1``: it keeps exactly the points whose element is in bounds in ``d``. Every
    ``d`` with ``R_d > size_d`` needs a clip. So the points that store are exactly one per element
    of the buffer: each in-bounds element once, none out of bounds (a GPU GEMM nest's edge tiles).
    """
    extent: list[int] = []
    owner: dict[str, int] = {}
    for d, (a, size) in enumerate(zip(nest.access, sizes)):
        if a.const != 0:
            return False
        for var in a.vars:
            if owner.setdefault(var, d) != d:
                return False  # one variable in two dimensions: not a one-to-one numbering
        r = _radix([(c, nest.ranges[v]) for v, c in a.terms])
        if r is None or r < size:
            return False
        extent.append(r)
    clipped = set()
    box = {v: (0, r - 1) for v, r in nest.ranges.items()}
    for c in nest.constraints:
        if poly_interval(c, box)[0] >= 0:
            continue  # holds at every point
        d = _clip(c, nest.access, sizes)
        if d is None:
            return False
        clipped.add(d)
    return all(r == size or d in clipped for d, (r, size) in enumerate(zip(extent, sizes)))


def _clip(c: Affine, access: list[Affine], sizes: tuple[int, ...]) -> int | None:
    """The dimension ``d`` whose out-of-bounds elements ``c >= 0`` cuts off and no more
    (``c = λ·(k - access_d)``, λ > 0, ``⌊k⌋ = size_d - 1``), else None."""
    for d, a in enumerate(access):
        if not a.terms or set(a.vars) != set(c.vars):
            continue
        v, k = a.terms[0]
        lam = -c.coeff(v) / k
        if lam <= 0 or any(c.coeff(u) != -lam * a.coeff(u) for u in a.vars):
            continue
        if math.floor(c.const / lam) == sizes[d] - 1:
            return d
    return None


def _radix(terms: list[tuple[Fraction, int]]) -> int | None:
    """``R`` where ``Σ coeff·i`` over ``i < range`` numbers ``[0, R)`` exactly once (the
    coefficients, in ascending order, are 1, r1, r1·r2, ...; ``R`` the ranges' product), else None."""
    expect = 1
    for coeff, rng in sorted(terms):
        if coeff != expect:
            return None
        expect *= rng
    return expect
