"""``verify(block)``: the structural rules of ``stripe.ir`` that every pass must keep.

Run after every pass in tests; a violation is a ``StripeError`` naming the block (by its path of
names, ``[k]`` for an unnamed statement block) and the offending item. The block given is the root.

Rules:

* Refinements: names (``into``) are unique in a block; ``agg_op`` is one of ``ir.AGG_OPS``; the
  access has one affine per dim of the ref's own shape. Root refinements have dir ``none`` and no
  ``from_``. Elsewhere a ref must refine (``from_``, else its own name) a ref of the enclosing
  block, with the parent's rank; the one exception is a local allocation: dir ``none``, no
  ``from_`` and no parent ref of that name. An ``out``/``inout`` ref may not refine an ``in`` one.
* Affines have integer coefficients and use only the block's own index names (accesses,
  constraints, ``load_index``); an index's affine uses the enclosing block's index names (at the
  root: none). Index names are unique and ranges are not negative.
* Bounds: each index ranges over ``[min(start), max(start) + range - 1]`` where the start's range is
  taken over the enclosing block's box. For each dim ``d`` of a view, with parent size ``P`` and
  view size ``S``, ``S <= P`` and every value ``a`` of the access must satisfy ``0 <= a`` and
  ``a + S <= P``. Without constraints the access range is its interval over the index box
  (``tile.bounds.poly_interval``). With constraints it is the exact rational projection of the
  polyhedron box ∩ constraints onto the access (Fourier–Motzkin, ``tile.bounds``), rounded inward
  to integers, so the usual padding constraints (``-1 + kx + x >= 0``) make their accesses valid.
  Blocks whose index space is empty, views with a zero size and local allocations are not checked.
* Statements: scalars start with ``$``, are defined once (``load``, ``load_index``, constants,
  intrinsic outputs) before any use (``store``, intrinsic inputs), and are local to their block.
  Loads, stores and specials name refinements of their block; nothing stores into (or is a
  special's output) an ``in`` refinement. Intrinsics are ``tile.builtins`` names or ``assign``,
  with exactly one output.
"""

from __future__ import annotations

import math
from fractions import Fraction

from stripe.ir import (
    AGG_OPS,
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
)
from stripe.printer import fmt_affine, fmt_ref
from tile.affine import Affine
from tile.bounds import Range, feasible, poly_interval, rational_bounds
from tile.builtins import BUILTINS
from tile.errors import Span, TileError

Box = dict[str, tuple[int, int]]
_NOWHERE = Span(0, 0)
_T = "\0access"  # the projected variable; no index can have this name


class StripeError(TileError):
    """A Stripe block tree that breaks a rule of the IR (a bug in the pass that produced it)."""

    kind = "stripe error"


def verify(block: Block) -> None:
    """Check the tree rooted at ``block``; raise ``StripeError`` at the first broken rule."""
    _Checker(block.name or "<root>", None, block, {}).run()


class _Checker:
    def __init__(self, path: str, parent: Block | None, block: Block, parent_box: Box | None):
        self.path, self.parent, self.b = path, parent, block
        self.parent_box = parent_box
        self.idx_names = {i.name for i in block.idxs}

    def fail(self, message: str, hint: str) -> StripeError:
        return StripeError(f"in block {self.path}: {message}", None, hint)

    def run(self) -> None:
        self.check_indexes()
        box = self.box()
        self.check_refs(box)
        self.check_stmts(box)

    # ------------------------------------------------------------------ indexes
    def affine(self, a: Affine, names: set[str], what: str, scope: str) -> None:
        if not a.is_integral:
            raise self.fail(
                f"{what}: `{fmt_affine(a)}` has a non-integer coefficient",
                "Stripe affines are integral; fractional Tile indexes must be defracted first",
            )
        unknown = [v for v in a.vars if v not in names]
        if unknown:
            known = ", ".join(sorted(names)) or "none"
            raise self.fail(
                f"{what}: `{fmt_affine(a)}` uses '{unknown[0]}', which is not one of {scope} ({known})",
                "add the index (a range-1 passthrough `name:1 = outer` for an enclosing index)",
            )

    def check_indexes(self) -> None:
        seen: set[str] = set()
        outer = {i.name for i in self.parent.idxs} if self.parent else set()
        for i in self.b.idxs:
            if i.name in seen:
                raise self.fail(f"index '{i.name}' is declared twice", "rename one of them")
            seen.add(i.name)
            if i.range < 0:
                raise self.fail(f"index '{i.name}' has a negative range {i.range}", "ranges are >= 0")
            if i.affine is not None:
                self.affine(i.affine, outer, f"index '{i.name}'", "the enclosing block's indexes")
        for c in self.b.constraints:
            self.affine(c, self.idx_names, f"constraint `{fmt_affine(c)} >= 0`", "the block's indexes")

    def box(self) -> Box | None:
        """Each index's range of values, tightened by the constraints; None if the block never runs."""
        if self.parent_box is None or any(i.range <= 0 for i in self.b.idxs):
            return None
        box: Box = {}
        for i in self.b.idxs:
            lo, hi = poly_interval(i.affine, self.parent_box) if i.affine is not None else (0, 0)
            box[i.name] = (int(lo), int(hi) + i.range - 1)
        if not self.b.constraints:
            return box
        conds = self.conditions(box)
        if not feasible(conds, list(box)):
            return None
        bounds = rational_bounds(conds, list(box))
        return {v: (math.ceil(bounds[v][0]), math.floor(bounds[v][1])) for v in box}

    def conditions(self, box: Box) -> list[Range]:
        conds = [Range(Affine.var(v), Fraction(lo), Fraction(hi), v, _NOWHERE) for v, (lo, hi) in box.items()]
        for c in self.b.constraints:
            hi = max(poly_interval(c, box)[1], Fraction(0))
            conds.append(Range(c, Fraction(0), hi, "constraint", _NOWHERE))
        return conds

    def access_range(self, a: Affine, box: Box) -> tuple[int, int]:
        if not self.b.constraints or a.is_constant:
            lo, hi = poly_interval(a, box)
            return int(lo), int(hi)
        equal = Range(a - Affine.var(_T), Fraction(0), Fraction(0), "access", _NOWHERE)
        conds = [*self.conditions(box), equal]
        lo, hi = rational_bounds(conds, [*box, _T])[_T]
        return math.ceil(lo), math.floor(hi)

    # ------------------------------------------------------------------ refinements
    def check_refs(self, box: Box | None) -> None:
        seen: set[str] = set()
        for r in self.b.refs:
            what = f"refinement '{r.into}' (`{fmt_ref(r)}`)"
            if r.into in seen:
                raise self.fail(f"refinement '{r.into}' is declared twice", "refinement names are unique")
            seen.add(r.into)
            if r.agg_op not in AGG_OPS:
                ops = ", ".join(repr(o) for o in AGG_OPS)
                raise self.fail(f"{what}: unknown agg_op '{r.agg_op}'", f"agg_op is one of {ops}")
            if len(r.access) != len(r.shape.dims):
                raise self.fail(
                    f"{what}: {len(r.access)} access affines for {len(r.shape.dims)} dims",
                    "give one access affine per dim",
                )
            for a in r.access:
                self.affine(a, self.idx_names, what, "the block's indexes")
            parent_ref = self.parent_ref(r, what)
            if parent_ref is not None and box is not None:
                self.check_bounds(r, parent_ref, box, what)

    def parent_ref(self, r: Refinement, what: str) -> Refinement | None:
        if self.parent is None:
            if r.dir is not RefDir.NONE or r.from_ is not None:
                raise self.fail(
                    f"{what}: a root refinement must have dir none and no parent",
                    "the root's refinements are the program's buffers",
                )
            return None
        src = next((p for p in self.parent.refs if p.into == r.source), None)
        if src is None:
            if r.dir is RefDir.NONE and r.from_ is None:
                return None  # a local allocation
            raise self.fail(
                f"{what} refines '{r.source}', which is not a refinement of the enclosing block",
                "refine one of the enclosing block's refinements (or make a `none` allocation)",
            )
        if len(r.access) != len(src.shape.dims):
            raise self.fail(
                f"{what}: access has rank {len(r.access)} but its parent '{src.into}' has rank "
                f"{len(src.shape.dims)}",
                "a refinement has one access affine per dim of the ref it refines",
            )
        if r.dir in (RefDir.OUT, RefDir.INOUT) and src.dir is RefDir.IN:
            raise self.fail(
                f"{what} writes ({r.dir.value}) through its parent '{src.into}', which is only `in`",
                "make the parent `inout` (or `out`)",
            )
        return src

    def check_bounds(self, r: Refinement, src: Refinement, box: Box, what: str) -> None:
        if any(d.size == 0 for d in r.shape.dims):
            return
        for d, (a, view, par) in enumerate(zip(r.access, r.shape.dims, src.shape.dims)):
            if view.size > par.size:
                raise self.fail(
                    f"{what}: dim {d} has size {view.size}, larger than its parent's {par.size}",
                    "a view fits inside the ref it refines",
                )
            lo, hi = self.access_range(a, box)
            if lo < 0 or hi + view.size > par.size:
                raise self.fail(
                    f"{what}: dim {d} covers [{lo}, {hi + view.size - 1}] over the index space, outside "
                    f"[0, {par.size - 1}] of '{src.into}'",
                    "shrink the index ranges or add the constraints that keep the access in bounds",
                )

    # ------------------------------------------------------------------ statements
    def check_stmts(self, box: Box | None) -> None:
        refs = {r.into: r for r in self.b.refs}
        defined: set[str] = set()

        def at(k: int, s: Statement) -> str:
            return f"{at(k, s)}"

        def ref(name: str, k: int, s: Statement, writes: bool) -> None:
            if name not in refs:
                raise self.fail(
                    f"{at(k, s)} names '{name}', which is not a refinement of this block",
                    "add a refinement of it to the block",
                )
            if writes and refs[name].dir is RefDir.IN:
                raise self.fail(
                    f"{at(k, s)} writes into '{name}', an `in` refinement",
                    "make the refinement `out` or `inout`",
                )

        def use(name: str, k: int, s: Statement) -> None:
            if name not in defined:
                raise self.fail(
                    f"{at(k, s)} uses the scalar '{name}' before it is defined",
                    "scalars are local to their block and must be defined by an earlier statement",
                )

        def define(name: str, k: int, s: Statement) -> None:
            if not name.startswith("$"):
                raise self.fail(f"{at(k, s)}: scalar '{name}' lacks '$'", "write '$name'")
            if name in defined:
                raise self.fail(
                    f"{at(k, s)} defines the scalar '{name}' a second time",
                    "scalars are assigned once; use a new name",
                )
            defined.add(name)

        for k, s in enumerate(self.b.stmts):
            if isinstance(s, Block):
                label = s.name or f"[{k}]"
                _Checker(f"{self.path}/{label}", self.b, s, box).run()
            elif isinstance(s, Load):
                ref(s.from_, k, s, False)
                define(s.into, k, s)
            elif isinstance(s, Store):
                use(s.from_, k, s)
                ref(s.into, k, s, True)
            elif isinstance(s, LoadIndex):
                self.affine(s.affine, self.idx_names, f"statement {k} (load_index)", "the block's indexes")
                define(s.into, k, s)
            elif isinstance(s, Constant):
                define(s.into, k, s)
            elif isinstance(s, Intrinsic):
                if s.name not in BUILTINS and s.name != "assign":
                    raise self.fail(
                        f"{at(k, s)}: unknown intrinsic '{s.name}'",
                        "intrinsics are tile.builtins names or 'assign'",
                    )
                if len(s.outputs) != 1:
                    raise self.fail(f"{at(k, s)} has {len(s.outputs)} outputs", "an intrinsic has one")
                for i in s.inputs:
                    use(i, k, s)
                define(s.outputs[0], k, s)
            elif isinstance(s, Special):
                for i in s.inputs:
                    ref(i, k, s, False)
                for o in s.outputs:
                    ref(o, k, s, True)
            else:
                raise self.fail(f"statement {k} is not a Stripe statement: {s!r}", "see stripe.ir.Statement")


__all__ = ["StripeError", "verify"]
