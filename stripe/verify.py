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
  taken over the enclosing block's box. Every view fits its parent's size (``S <= P`` per dim).
  Bounds are checked where memory is touched: for a refinement that a statement of its block uses
  (or that no nested block refines further), each dim's *position* — the sum of the accesses along
  its chain of refinements up to the buffer, where the strides agree — must satisfy
  ``0 <= pos`` and ``pos + S <= P`` of the buffer. So a tile view of an outer block may overhang
  the buffer (the last, partial tile; a convolution's halo) as long as the constraints of the
  nested block that reads it keep every load and store inside. A parent's index reaches the
  nested position through a range-1 passthrough index (``X:1 = X``); other parent indexes count
  with their whole range. Where a view's stride differs from its parent's, its dim is checked
  against the parent view instead. Without constraints the access range is its interval over the index box
  (``tile.bounds.poly_interval``). With constraints only the points meeting them count, so the
  usual padding constraints (``-1 + kx + x >= 0``) make their accesses valid: a box of at most
  ``ENUM_LIMIT`` points is checked exactly, point by point; a larger one by projecting box ∩
  constraints onto the access with integer Fourier–Motzkin (each derived inequality divided by its
  gcd, its constant floored), whose bounds are never tighter than the truth, so a valid block is
  never rejected. A projection growing past ``FM_LIMIT`` inequalities is given up, and that dim
  gets only the ``S <= P`` check. The box is tightened the same way before nested blocks use it
  (``stripe.index_points`` holds the box, the enumeration and the projection).
  Blocks with no valid point, views with a zero size and local allocations get no bounds check.
* Statements: scalars start with ``$``, are defined once (``load``, ``load_index``, constants,
  intrinsic outputs) before any use (``store``, intrinsic inputs), and are local to their block.
  Loads, stores and specials name refinements of their block; nothing stores into (or is a
  special's output) an ``in`` refinement. Intrinsics are ``tile.builtins`` names or ``assign``,
  with exactly one output.
* Plans: a block's ``plan`` (``stripe.plans``) names indexes and refinements the block has, with
  tiles and ranges consistent with it, and the block carries the tags its emitter expects.
"""

from __future__ import annotations

from dataclasses import dataclass

from stripe import plans
from stripe.index_points import Box, IndexPoints
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
    ref_table,
)
from stripe.printer import fmt_affine, fmt_ref, fmt_stmt
from tile.affine import Affine
from tile.bounds import poly_interval
from tile.builtins import BUILTINS
from tile.errors import TileError

FM_LIMIT = 300  # inequalities; past it a projection gives up (and its check is skipped)
ENUM_LIMIT = 200_000  # index points; a constrained block up to this size is checked point by point


class StripeError(TileError):
    """A Stripe block tree that breaks a rule of the IR (a bug in the pass that produced it)."""

    kind = "stripe error"


def verify(block: Block) -> None:
    """Check the tree rooted at ``block``; raise ``StripeError`` at the first broken rule."""
    _Checker(block.name or "<root>", None, block, {}, {}).run()


@dataclass(frozen=True)
class _Pos:
    """Where one dim of a view starts in the buffer (or view) it is checked against: ``affine`` of
    the block's indexes plus a constant in ``[lo, hi]`` (parent indexes not passed through)."""

    buffer: str
    size: int  # that buffer's size in this dim
    affine: Affine
    lo: int = 0
    hi: int = 0
    # The same position bounded another way: ``own`` (this view's access alone) plus the parent
    # position's whole range in ``[own_lo, own_hi]``; the checks take the tighter of the two.
    own: Affine | None = None
    own_lo: int = 0
    own_hi: int = 0


class _BlockRules:
    """The checks of one block: its place in the tree (``path``, ``parent``), what the enclosing
    checker knows (its index points' box and access ranges, its views' positions), and the rules
    of its indexes and affines."""

    def __init__(
        self,
        path: str,
        parent: Block | None,
        block: Block,
        parent_box: Box | None,
        parent_pos: dict[str, tuple[_Pos, ...]],
        parent_range=None,
    ):
        self.path, self.parent, self.b = path, parent, block
        self.parent_box = parent_box
        self.parent_pos = parent_pos
        self.parent_range = parent_range  # the enclosing block's access_range over its points
        self.pos: dict[str, tuple[_Pos, ...]] = {}
        self.idx_names = {i.name for i in block.idxs}

    def fail(self, message: str, hint: str) -> StripeError:
        return StripeError(f"in block {self.path}: {message}", None, hint)

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


class _RefinementRules(_BlockRules):
    """The rules of a block's refinements: names, agg_ops and ranks; each one's parent ref; sizes
    that fit the parent; and, where memory is touched, each dim's position in its buffer inside
    the buffer over the block's points (see the module docstring)."""

    def check_refs(self, points: IndexPoints) -> None:
        seen: set[str] = set()
        touched = self.touched()
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
            self.pos[r.into] = self.position(r, parent_ref)
            if parent_ref is not None:
                self.check_sizes(r, parent_ref, what)
                if points.box is not None and r.into in touched:
                    self.check_bounds(r, points, what)

    def touched(self) -> set[str]:
        """Refinements whose bounds are checked here: used by a statement of this block, or not
        refined by any nested block (a nested block checks the positions it touches itself)."""
        used: set[str] = set()
        refined: set[str] = set()
        for s in self.b.stmts:
            if isinstance(s, Block):
                refined.update(r.source for r in s.refs)
            elif isinstance(s, Load):
                used.add(s.from_)
            elif isinstance(s, Store):
                used.add(s.into)
            elif isinstance(s, Special):
                used.update(s.inputs)
                used.update(s.outputs)
        return used | {r.into for r in self.b.refs if r.into not in refined}

    def position(self, r: Refinement, src: Refinement | None) -> tuple[_Pos, ...]:
        """Each dim's start in its buffer, as an affine of this block's indexes (see the docstring)."""
        if src is None or self.parent_box is None:  # a buffer, a local allocation, or never run
            return tuple(_Pos(r.into, d.size, Affine()) for d in r.shape.dims)
        through = {
            i.affine.vars[0]: Affine.var(i.name)
            for i in self.b.idxs
            if i.range == 1 and i.affine is not None and len(i.affine.vars) == 1
            and i.affine == Affine.var(i.affine.vars[0])
        }
        parent = self.parent_pos.get(src.into)
        out = []
        for d, (a, view, par) in enumerate(zip(r.access, r.shape.dims, src.shape.dims)):
            p = parent[d] if parent is not None and d < len(parent) else None
            if p is None or view.stride != par.stride:
                out.append(_Pos(src.into, par.size, a))
                continue
            kept = Affine.build({v: c for v, c in p.affine.coeffs.items() if v in through})
            rest = p.affine - kept
            span = self.parent_range(rest) if self.parent_range and not rest.is_constant else None
            if span is None:
                span = poly_interval(rest, self.parent_box) if self.parent_box is not None else (0, 0)
            lo, hi = span
            whole = self.parent_range(p.affine) if self.parent_range and p.affine.vars else None
            whole = whole or poly_interval(p.affine, self.parent_box or {})
            out.append(
                _Pos(p.buffer, p.size, a + kept.substitute(through), p.lo + int(lo), p.hi + int(hi),
                     a, p.lo + int(whole[0]), p.hi + int(whole[1]))
            )
        return tuple(out)

    def parent_ref(self, r: Refinement, what: str) -> Refinement | None:
        if self.parent is None:
            if r.dir is not RefDir.NONE or r.from_ is not None:
                raise self.fail(
                    f"{what}: a root refinement must have dir none and no parent",
                    "the root's refinements are the program's buffers",
                )
            return None
        src = ref_table(self.parent).get(r.source)
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

    def check_sizes(self, r: Refinement, src: Refinement, what: str) -> None:
        if any(d.size == 0 for d in r.shape.dims):
            return
        for d, (view, par) in enumerate(zip(r.shape.dims, src.shape.dims)):
            if view.size > par.size:
                raise self.fail(
                    f"{what}: dim {d} has size {view.size}, larger than its parent's {par.size}",
                    "a view fits inside the ref it refines",
                )

    def check_bounds(self, r: Refinement, points: IndexPoints, what: str) -> None:
        if any(d.size == 0 for d in r.shape.dims):
            return
        for d, (view, pos) in enumerate(zip(r.shape.dims, self.pos[r.into])):
            span = points.access_range(pos.affine)
            if span is None:
                continue
            lo, hi = span[0] + pos.lo, span[1] + pos.hi
            if pos.own is not None and (lo < 0 or hi + view.size > pos.size):
                other = points.access_range(pos.own)
                if other is not None:
                    lo, hi = max(lo, other[0] + pos.own_lo), min(hi, other[1] + pos.own_hi)
            if lo < 0 or hi + view.size > pos.size:
                raise self.fail(
                    f"{what}: dim {d} covers [{lo}, {hi + view.size - 1}] over the index space, outside "
                    f"[0, {pos.size - 1}] of '{pos.buffer}'",
                    "shrink the index ranges or add the constraints that keep the access in bounds",
                )


class _Checker(_RefinementRules):
    """One block: its indexes, its index points, its refinements, then its statements in order
    (a nested block checked by a checker of its own)."""

    def run(self) -> None:
        self.check_indexes()
        points = IndexPoints(self.b, self.parent_box, ENUM_LIMIT, FM_LIMIT)
        self.check_refs(points)
        self.check_plan()
        self.check_stmts(points)

    def check_plan(self) -> None:
        """A plan names what its block has, with consistent tiles and ranges (``stripe.plans``)."""
        if self.b.plan is None:
            return
        for problem in plans.problems(self.b.plan, self.b):
            hint = "a pass that rewrites a planned block keeps its plan valid or drops it (plan=None)"
            raise self.fail(f"its {plans.kind(self.b.plan)} plan {problem}", hint)

    def check_stmts(self, points: IndexPoints) -> None:
        scalars = _Statements(self)
        for k, s in enumerate(self.b.stmts):
            if isinstance(s, Block):
                label = s.name or f"[{k}]"
                inner = _Checker(f"{self.path}/{label}", self.b, s, points.box, self.pos)
                if points.box is not None:
                    inner.parent_range = points.access_range
                inner.run()
            else:
                scalars.check(k, s)


class _Statements:
    """The rules of a block's own statements: scalars are defined once (with a ``$``) before any
    use; loads, stores and specials name refinements of the block, and never write an ``in`` one;
    intrinsics are builtins with one output."""

    def __init__(self, checker: _BlockRules):
        self.checker = checker
        self.fail = checker.fail
        self.refs = {r.into: r for r in checker.b.refs}
        self.defined: set[str] = set()

    def check(self, k: int, s: Statement) -> None:
        if isinstance(s, Load):
            self.ref(s.from_, k, s, False)
            self.define(s.into, k, s)
        elif isinstance(s, Store):
            self.use(s.from_, k, s)
            self.ref(s.into, k, s, True)
        elif isinstance(s, LoadIndex):
            c = self.checker
            c.affine(s.affine, c.idx_names, f"statement {k} (load_index)", "the block's indexes")
            self.define(s.into, k, s)
        elif isinstance(s, Constant):
            self.define(s.into, k, s)
        elif isinstance(s, Intrinsic):
            if s.name not in BUILTINS and s.name != "assign":
                raise self.fail(
                    f"{_at(k, s)}: unknown intrinsic '{s.name}'",
                    "intrinsics are tile.builtins names or 'assign'",
                )
            if len(s.outputs) != 1:
                raise self.fail(f"{_at(k, s)} has {len(s.outputs)} outputs", "an intrinsic has one")
            for i in s.inputs:
                self.use(i, k, s)
            self.define(s.outputs[0], k, s)
        elif isinstance(s, Special):
            for i in s.inputs:
                self.ref(i, k, s, False)
            for o in s.outputs:
                self.ref(o, k, s, True)
        else:
            raise self.fail(f"statement {k} is not a Stripe statement: {s!r}", "see stripe.ir.Statement")

    def ref(self, name: str, k: int, s: Statement, writes: bool) -> None:
        if name not in self.refs:
            raise self.fail(
                f"{_at(k, s)} names '{name}', which is not a refinement of this block",
                "add a refinement of it to the block",
            )
        if writes and self.refs[name].dir is RefDir.IN:
            raise self.fail(
                f"{_at(k, s)} writes into '{name}', an `in` refinement",
                "make the refinement `out` or `inout`",
            )

    def use(self, name: str, k: int, s: Statement) -> None:
        if name not in self.defined:
            raise self.fail(
                f"{_at(k, s)} uses the scalar '{name}' before it is defined",
                "scalars are local to their block and must be defined by an earlier statement",
            )

    def define(self, name: str, k: int, s: Statement) -> None:
        if not name.startswith("$"):
            raise self.fail(f"{_at(k, s)}: scalar '{name}' lacks '$'", "write '$name'")
        if name in self.defined:
            raise self.fail(
                f"{_at(k, s)} defines the scalar '{name}' a second time",
                "scalars are assigned once; use a new name",
            )
        self.defined.add(name)


def _at(k: int, s: Statement) -> str:
    return f"statement {k} (`{fmt_stmt(s)}`)"


__all__ = ["StripeError", "verify"]
