"""Which buffers of a program must be zero-filled before every run, so reused buffers are safe.

Stripe gives every buffer of the ``#program`` block zeroed memory (``ref_interp.stripe_exec``),
and the runner reuses a program's buffers from call to call: a buffer still holding the last
call's values must be zeroed again unless the program overwrites all of it before anything reads
it. The lowering already starts every aggregated output with an explicit ``zero`` or
``agg_init_*`` kernel, and elementwise kernels store every element, so most buffers need no fill
of the runner's own; this module proves that, conservatively, per buffer:

* the first kernel of ``#main`` that names the buffer must only write it (``out``, never ``in``);
* and it writes every element before reading any: either a block of whole-view specials (fills,
  copies, reshapes, gathers, scatters, ...) over the whole buffer, or a nest of blocks without
  constraints whose composed access ``Σ coeff·index`` per dimension is a mixed-radix numbering of
  ``[0, size)`` (every element exactly once) and whose store plainly assigns (no aggregation).

Anything else (constraints, index affines, reinterpreted views, aggregating stores, a buffer no
kernel names) is zeroed: a needless fill costs time, a missing one leaks a previous call's values.
A kernel without indexes whose first statement naming the buffer is such a block covers it too
(``one_kernel``'s partial block nested in its combine). A buffer tagged ``counter`` (a last
work-group's counter, which its kernel leaves at zero) is zeroed once, when allocated
(``zeroed_once``), never per call.
"""

from __future__ import annotations

from fractions import Fraction

from stripe.ir import Block, Load, RefDir, Refinement, Special, Store
from stripe.passes.one_kernel import COUNTER

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
    terms: list[list[tuple[Fraction, int]]] = [[] for _ in sizes]
    consts = [Fraction(0)] * len(sizes)
    if not _collect(kernel, ref, strides, terms, consts, set()):
        return False
    return all(c == 0 for c in consts) and all(_radix(t, n) for t, n in zip(terms, sizes))


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


def _collect(
    block: Block,
    ref: Refinement,
    strides: tuple[int, ...],
    terms: list[list[tuple[Fraction, int]]],
    consts: list[Fraction],
    seen: set[str],
) -> bool:
    """Add ``block``'s part of the composed access to ``terms`` (coefficient, range per index) and
    ``consts``; False where the nest is not one this module can reason about."""
    if block.constraints or any(i.affine is not None for i in block.idxs):
        return False
    if len(ref.access) != len(strides) or tuple(d.stride for d in ref.shape.dims) != strides:
        return False  # a view that reinterprets the buffer's layout
    if ref.agg_op not in ("", "assign"):
        return False
    ranges = {i.name: i.range for i in block.idxs}
    for d, poly in enumerate(ref.access):
        consts[d] += poly.const
        for var, coeff in poly.terms:
            if var not in ranges:
                return False
            key = f"{id(block)}:{var}"
            if key in seen:
                return False  # one index in two dimensions: not a one-to-one numbering
            seen.add(key)
            if ranges[var] > 1:
                terms[d].append((coeff, ranges[var]))
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
        return _collect(s, inner[0], strides, terms, consts, seen)
    return False


def _radix(terms: list[tuple[Fraction, int]], size: int) -> bool:
    """``Σ coeff·i`` over ``i < range`` numbers ``[0, size)`` exactly once: the coefficients, in
    ascending order, are 1, r1, r1·r2, ... and the ranges multiply to ``size``."""
    expect = 1
    for coeff, rng in sorted(terms):
        if coeff != expect:
            return False
        expect *= rng
    return expect == size
