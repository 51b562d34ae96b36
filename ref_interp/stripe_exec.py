"""An exact interpreter of Stripe programs, following the execution semantics of ``stripe.ir``.

``run_stripe(program, inputs, precision)`` allocates one flat buffer per refinement of the root
block (zero-filled, in the ``Numerics`` storage of its dtype), fills those tagged ``input`` and
returns those tagged ``output``, shaped to their sizes. Values follow ``ref_interp.elementwise``
exactly: an ``Intrinsic`` is evaluated as the Tile builtin of the same name.

How a block runs:

* Its index points are enumerated in row-major order of its indexes (first index slowest); points
  failing a constraint are skipped. Each refinement becomes a view: the base position of its
  parent's view plus ``Σ_d access_d * parent.dims[d].stride``.
* A block whose statements are only ``Load``/``Store``/``LoadIndex``/``Constant``/``Intrinsic`` is
  evaluated for all of its points at once, in chunks of at most ``CHUNK`` points: each statement
  runs for every point of the chunk before the next statement. This equals running the points one
  after another whenever no point reads an element another point writes (which Stripe's any-order
  semantics makes a race anyway). Stores use ``ufunc.at`` for ``add``/``mul``/``max``/``min``; for
  ``assign`` (and ``""``), when several points write one element, the last in row-major point
  order wins.
* A block with nested blocks, specials or allocations of its own runs its points one by one in
  Python; a nested block sees the point through its index affines and refinement accesses.

Decisions the IR leaves open: a refinement that refines nothing of the enclosing block and has dir
``none`` is a fresh zero-filled allocation for each point of its block; a refinement's dtype may
differ from its buffer's (loads and stores convert); specials write plainly (no ``agg_op``); float
``Constant``s keep float64 (or exact) precision until an operation converts them, as Tile literals
do; every load and store is checked to fall inside its buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import lru_cache

import numpy as np

from ref_interp.contraction import max_points_default
from ref_interp.elementwise import IMPLS, apply
from ref_interp.numerics import Numerics
from ref_interp.stripe_special import View, check_bounds, new_buffer, read, run_special, write
from stripe.ir import (
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
    block_error,
    where,
)
from stripe.scope import Scope, check_access_rank, missing_parent
from stripe.specials import STRUCTURAL
from tile.affine import Affine
from tile.builtins import BUILTINS
from tile.dtypes import DType
from tile.errors import TileInputError, TileLimitError
from tile.tuples import grids
from tile.typed import TCall, TensorType, TRef

CHUNK = 1 << 20

_VECTOR_STMTS = (Load, Store, LoadIndex, Constant, Intrinsic)


# ---------------------------------------------------------------------------- public API
def stripe_input_names(block: Block) -> list[tuple[str, tuple[int, ...], DType]]:
    """``(name, sizes, dtype)`` of every root refinement tagged ``input``, in declaration order."""
    return [(r.into, r.shape.sizes, r.shape.dtype) for r in block.refs if "input" in r.tags]


def run_stripe(
    program: Block,
    inputs: Mapping[str, np.ndarray] | None = None,
    precision: str = "native",
    *,
    max_points: int | None = None,
) -> dict[str, np.ndarray]:
    """Run a Stripe program; return every root refinement tagged ``output`` by name.

    ``max_points`` bounds the index space of any one block (default as for Tile contractions).
    """
    nx = Numerics(precision)
    inputs = dict(inputs or {})
    declared = {name: (sizes, dt) for name, sizes, dt in stripe_input_names(program)}
    for name in inputs:
        if name not in declared:
            raise TileInputError(
                f"an array was given for '{name}', which is not an input of this Stripe program",
                None,
                hint=f"the inputs are: {', '.join(declared) or '(none)'}",
            )
    views: dict[str, View] = {}
    for ref in program.refs:
        if ref.from_ is not None:
            raise block_error(
                program,
                f"root refinement '{ref.into}' refines '{ref.from_}', but the root has no parent",
                "the root block's refinements are the program's buffers",
            )
        buf = new_buffer(nx, ref.into, ref.shape.dtype, ref.shape.dims)
        views[ref.into] = View(ref.into, buf, 0, ref.shape.dims, ref.shape.dtype, ref.agg_op)
    for name, (sizes, dt) in declared.items():
        write(nx, views[name], _input_array(nx, name, sizes, dt, inputs), "the input")
    limit = max_points if max_points is not None else max_points_default()
    _Machine(nx, limit).block(program, {}, views, root=True)
    return {
        r.into: np.array(read(nx, views[r.into], "the output"), copy=True)
        for r in program.refs
        if "output" in r.tags
    }


def _input_array(nx: Numerics, name: str, sizes, dt: DType, inputs) -> np.ndarray:
    shown = f"{name}[{', '.join(map(str, sizes))}]"
    if name not in inputs:
        raise TileInputError(f"no array given for input '{shown}'", None, hint="pass one array per input")
    arr = np.asarray(inputs[name])
    try:
        DType.of(arr.dtype)
    except TypeError:
        raise TileInputError(
            f"input '{name}' has dtype {arr.dtype}, which Tile does not have",
            None,
            hint="use bool, int8..int64, uint8..uint64, float16/32/64 or ml_dtypes.bfloat16 arrays",
        ) from None
    if arr.shape != tuple(sizes):
        raise TileInputError(
            f"input '{shown}' was given an array of shape {arr.shape}",
            None,
            hint=f"pass an array of shape {tuple(sizes)}",
        )
    return nx.cast(arr, dt)


# ------------------------------------------------------------------------------- helpers
class _AffineError(Exception):
    pass


@lru_cache(maxsize=4096)
def _compile(aff: Affine, names: tuple[str, ...]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``aff`` as an integer constant and ``(position in names, integer coefficient)`` terms."""
    if not aff.is_integral:
        raise _AffineError(f"the affine '{aff}' has a non-integer coefficient")
    terms = []
    for v, c in aff.terms:
        if v not in names:
            known = ", ".join(names) or "none"
            raise _AffineError(f"the affine '{aff}' uses '{v}', which is not an index here (known: {known})")
        terms.append((names.index(v), int(c)))
    return int(aff.const), tuple(terms)


@lru_cache(maxsize=4096)
def _offset(access: tuple[Affine, ...], strides: tuple[int, ...]) -> Affine:
    """``Σ_d access_d * strides_d``: a refinement's base relative to its parent's."""
    out = Affine()
    for a, s in zip(access, strides):
        out = out + a * s
    return out


def _chunks(starts: list[int], ranges: list[int]) -> Iterator[tuple[list[np.ndarray], tuple[int, ...]]]:
    """Cover the index box with grids of at most ``CHUNK`` points, in row-major order (see
    ``tile.tuples.grids``)."""
    return grids([(s, s + r - 1) for s, r in zip(starts, ranges)], list(ranges), CHUNK)


def _aggregate(op: str, data: np.ndarray, where: np.ndarray, values: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        if op in ("", "assign"):
            if len(where) > 1:
                # numpy leaves repeated fancy-index assignment unspecified: keep the last writer.
                uniq, first_from_end = np.unique(where[::-1], return_index=True)
                if len(uniq) < len(where):
                    data[uniq] = values[len(where) - 1 - first_from_end]
                    return
            data[where] = values
        elif op == "add":
            np.add.at(data, where, values)
        elif op == "mul":
            np.multiply.at(data, where, values)
        elif data.dtype == object:
            # Fractions mixed with float ±inf/nan: compare one by one; nan wins, as np.maximum does
            pick = (lambda a, b: a if a > b else b) if op == "max" else (lambda a, b: a if a < b else b)
            for w, v in zip(where.tolist(), values.tolist()):
                cur = data[w]
                data[w] = cur if cur != cur else v if v != v else pick(cur, v)
        else:
            (np.maximum if op == "max" else np.minimum).at(data, where, values)


# ------------------------------------------------------------------------------ machine
class _Machine:
    def __init__(self, nx: Numerics, max_points: int):
        self.nx = nx
        self.max_points = max_points

    def block(self, block: Block, env: dict[str, int], outer: dict[str, View], root: bool = False) -> None:
        """Run ``block`` for one point of its parent (index values ``env``, views ``outer``)."""
        starts = []
        for ix in block.idxs:
            if ix.range < 0:
                raise block_error(block, f"index '{ix.name}' has a negative range", "ranges are sizes")
            if ix.affine is None:
                starts.append(0)
                continue
            try:
                const, terms = _compile(ix.affine, tuple(env))
            except _AffineError as e:
                raise block_error(
                    block, f"index '{ix.name}': {e}", "an index affine uses the parent's indexes"
                ) from None
            values = list(env.values())
            starts.append(const + sum(c * values[p] for p, c in terms))
        ranges = [ix.range for ix in block.idxs]
        total = int(np.prod(ranges, dtype=object)) if ranges else 1
        if total > self.max_points:
            raise TileLimitError(
                f"{where(block)}: its index space has {total} points, more than the interpreter's limit "
                f"of {self.max_points}",
                None,
                hint="use smaller inputs, or raise the limit (max_points=..., or TILE_INTERP_MAX_POINTS)",
            )
        if total == 0:
            return
        local = any(r.source not in outer for r in block.refs) and not root
        if not local and all(isinstance(s, _VECTOR_STMTS) for s in block.stmts):
            for vals, grid in _chunks(starts, ranges):
                self.points(block, vals, grid, outer, root)
            return
        for point in itertools.product(*(range(s, s + r) for s, r in zip(starts, ranges))):
            self.points(block, [np.asarray(v, dtype=np.int64) for v in point], (), outer, root)

    def points(self, block: Block, vals: list[np.ndarray], grid: tuple[int, ...], outer, root: bool) -> None:
        """Run the statements of ``block`` for the points of ``grid`` that satisfy its constraints."""
        names = tuple(ix.name for ix in block.idxs)

        def affine(aff: Affine, what: str) -> np.ndarray:
            try:
                const, terms = _compile(aff, names)
            except _AffineError as e:
                raise block_error(block, f"{what}: {e}", "affines here use the block's own indexes") from None
            out = np.asarray(const, dtype=np.int64)
            for p, c in terms:
                out = out + (vals[p] if c == 1 else c * vals[p])
            return out

        sel = None
        if block.constraints:
            ok = np.ones(grid, dtype=bool)
            for c in block.constraints:
                ok &= affine(c, "a constraint") >= 0
            sel = np.flatnonzero(ok)
            if not len(sel):
                return
        n = int(np.prod(grid, dtype=np.int64)) if sel is None else len(sel)

        def per_point(value: np.ndarray) -> np.ndarray:
            flat = np.broadcast_to(value, grid).reshape(-1)
            return flat if sel is None else flat[sel]

        def point(k: int) -> str:
            """The index values of point ``k`` of this chunk, for error messages."""
            shown = ", ".join(f"{nm}={int(per_point(v)[k])}" for nm, v in zip(names, vals))
            return f"({shown})" if shown else "the block's only point"

        views = {r.into: self.view(block, r, outer, root, affine, per_point, n) for r in block.refs}

        scope: Scope[View, tuple[np.ndarray, DType]] = Scope(block, views)
        get, put, ref = scope.get, scope.put, scope.ref

        nx = self.nx
        for stmt in block.stmts:
            if isinstance(stmt, Load):
                v = ref(stmt.from_, stmt)
                check_bounds(v, v.base, "a load", point)
                put(stmt.into, (nx.cast(v.buf.data[v.base], v.dtype), v.dtype))
            elif isinstance(stmt, Store):
                v = ref(stmt.into, stmt)
                value, _ = get(stmt.from_)
                check_bounds(v, v.base, "a store", point)
                value = nx.cast(nx.cast(np.broadcast_to(value, (n,)), v.dtype), v.buf.dtype)
                if v.agg_op not in ("", "assign", "add", "mul", "max", "min"):
                    raise block_error(
                        block,
                        f"refinement '{v.name}' has unknown agg_op '{v.agg_op}'",
                        "agg_op is one of assign, add, mul, max, min",
                    )
                _aggregate(v.agg_op, v.buf.data, v.base, value)
            elif isinstance(stmt, LoadIndex):
                index = per_point(affine(stmt.affine, f"load_index into '{stmt.into}'"))
                put(stmt.into, (index, DType.INT64))
            elif isinstance(stmt, Constant):
                stored = DType.FLOAT64 if stmt.dtype.is_float else stmt.dtype
                put(stmt.into, (nx.const(stmt.value, stored), stmt.dtype))
            elif isinstance(stmt, Intrinsic):
                value = self.intrinsic(block, stmt, get)
                put(stmt.outputs[0], (value, stmt.dtype))
            elif isinstance(stmt, Special):
                run_special(
                    nx, stmt, {k: replace(v, base=int(v.base[0])) for k, v in views.items()}, where(block)
                )
            elif isinstance(stmt, Block):
                env = {nm: int(per_point(v)[0]) for nm, v in zip(names, vals)}
                self.block(stmt, env, {k: replace(v, base=int(v.base[0])) for k, v in views.items()})
            else:
                raise block_error(block, f"unknown statement {stmt!r}", "see stripe.ir.Statement")

    def view(self, block: Block, r: Refinement, outer, root: bool, affine, per_point, n: int) -> View:
        """What refinement ``r`` denotes at the current points (its base an int64 array per point)."""
        if root:
            parent = outer[r.into]
            return View(
                r.into, parent.buf, np.zeros(n, dtype=np.int64), r.shape.dims, r.shape.dtype, r.agg_op
            )
        if r.source not in outer:
            if r.dir is not RefDir.NONE or r.from_ is not None:
                raise missing_parent(block, r, "refine a refinement of the enclosing block")
            buf = new_buffer(self.nx, r.into, r.shape.dtype, r.shape.dims)
            return View(r.into, buf, np.zeros(n, dtype=np.int64), r.shape.dims, r.shape.dtype, r.agg_op)
        parent = outer[r.source]
        check_access_rank(block, r, len(parent.dims))
        off = _offset(r.access, tuple(d.stride for d in parent.dims))
        base = parent.base + per_point(affine(off, f"the access of '{r.into}'"))
        return View(r.into, parent.buf, base, r.shape.dims, r.shape.dtype, r.agg_op)

    def intrinsic(self, block: Block, stmt: Intrinsic, get) -> np.ndarray:
        if len(stmt.outputs) != 1:
            raise block_error(
                block,
                f"intrinsic '{stmt.name}' must have one output, not {len(stmt.outputs)}",
                "an intrinsic computes one scalar",
            )
        args = [get(x) for x in stmt.inputs]
        if stmt.name == "assign":
            if len(args) != 1:
                raise block_error(block, "intrinsic 'assign' takes one input", "assign copies one scalar")
            return self.nx.cast(args[0][0], stmt.dtype)
        if stmt.name not in IMPLS or stmt.name in STRUCTURAL:
            hint = (
                "whole-tensor operations are Specials"
                if stmt.name in STRUCTURAL
                else "intrinsics are the elementwise builtins of tile.builtins, or assign"
            )
            raise block_error(block, f"unknown intrinsic '{stmt.name}'", hint)
        want = BUILTINS[stmt.name].tensors
        if len(args) != want:
            raise block_error(
                block,
                f"intrinsic '{stmt.name}' takes {want} input(s), got {len(args)}",
                "check the intrinsic's inputs",
            )
        shape = np.broadcast_shapes(*(a.shape for a, _ in args))
        refs = tuple(TRef(x, TensorType(dt, a.shape)) for x, (a, dt) in zip(stmt.inputs, args))
        call = TCall(stmt.name, refs, TensorType(stmt.dtype, shape), tuple(stmt.params))
        return apply(self.nx, call, [a for a, _ in args])


__all__ = ["CHUNK", "run_stripe", "stripe_input_names"]
