"""Lowering a bound Tile program to Stripe.

``lower(bound)`` gives the ``#program`` block: every tensor a buffer (dense, row-major), the
``#main`` block refining them, and per operation one or more ``#kernel`` blocks:

* **contractions** are reduced and defracted first (``tile.transforms``), so every index
  expression has integer coefficients; the block's indexes are the exact index box (shifted to
  start at 0), its constraints the conditions the box does not imply, one ``in`` refinement per
  operand and an ``out`` refinement aggregating with the contraction's op. Unwritten elements
  must end up 0 (or the ``default``), and written ones the plain aggregate, so:
  ``+`` stores into a zeroed output; ``=`` into a zeroed output or a copy of the default;
  the others (and ``+`` with a default) aggregate into a temporary started at the aggregation's
  identity, mark the elements they write in a mask, and a final block selects
  ``mask ? aggregate : default-or-0``; except where the block provably writes every output
  element (no constraints, and an output access numbering every element): then the output itself
  starts at the identity (``zero`` for ``+``) and aggregates, with no mask and no select.
  With ``widen`` (strict mode, and targets without matrix units: ``backends.driver.widened``; on
  targets with them, only the products no matrix unit takes: ``"unshaped"``), a float16 or
  bfloat16 **matrix product** (``TContraction.is_matrix_product``) is lowered as the interpreter
  computes it (docs/semantics.md §8.1.1): the same contraction into
  a float32 temporary ``<name>_f32`` (its operands converted to the result type first, then
  multiplied exactly in float32 and summed in float32), and an elementwise kernel that rounds the
  temporary to the result type once. Without it the contraction sums in its own type, the form a
  matrix unit's passes (``tensorize``) recognize.
* **elementwise** statements become a block over the output's shape, broadcasting by zero
  accesses, with one ``Intrinsic`` per operation; ``index`` becomes ``load_index``; a composite
  (``tile.composites``: the binary cross-entropy, ``reverse_grad``) becomes its expansion's.
* **reshape, gather, scatter, shape**, the **softmaxes** and the **PRNG** calls become ``Special``
  statements in blocks of their own (hoisted out of elementwise expressions into temporaries).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from stripe.ir import (
    Block,
    Constant,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
    TensorShape,
)
from tile.affine import Affine
from tile.ast import AggOp, CombOp
from tile.bounds import index_box, merge_parallel, plain_box, poly_interval, ranges
from tile.composites import COMPOSITES, expand
from tile.dtypes import DType, promote
from tile.errors import TileIndexError
from tile.gc_pause import paused_gc
from tile.size_inputs import require_sizes
from tile.transforms import transform
from tile.transforms.emit import format_contraction
from tile.tuples import space
from tile.typed import BoundProgram, TAssign, TCall, TConst, TContraction, TensorType, TExpr, TRef

SPECIALS = frozenset({"reshape", "gather", "scatter", "shape", "builtin_softmax", "builtin_logsoftmax"})
SPECIALS |= {"prng_step", "prng_state", "prng_value"}  # tile.prng
_AGG = {AggOp.SUM: "add", AggOp.PROD: "mul", AggOp.MAX: "max", AggOp.MIN: "min", AggOp.ASSIGN: "assign"}
_COMB = {CombOp.NONE: "none", CombOp.MUL: "mul", CombOp.ADD: "add", CombOp.EQ: "eq", CombOp.COND: "cond"}


@paused_gc()  # a long program lowers to hundreds of thousands of objects: no cycle hunts meanwhile
def lower(bound: BoundProgram, name: str = "program", *, strict: bool = False,
          widen: bool | str | None = None) -> Block:
    """The Stripe program of a bound (concrete-shaped) Tile program; ``strict``: strict mode's
    lowering (§8.3); ``widen`` (default: ``strict``): float16 and bfloat16 matrix products
    accumulate in float32, as the interpreter's (§8.1.1); ``"unshaped"``: only those without a
    matrix shape (``TContraction.has_matrix_shape``: what no matrix unit takes)."""
    require_sizes(bound)  # symbolic sizes (a size input bound without its value) size no buffer
    return _Lowering(bound, strict, strict if widen is None else widen).program(name)


class _Kernels:
    """The program's buffers (one per tensor, dense and row-major, with temporaries added as
    lowering needs them) and the ``#kernel`` blocks lowered so far, in order. A Special statement
    is a kernel of its own (``special``)."""

    def __init__(self, bound: BoundProgram, strict: bool = False, widen: bool | str = False):
        self.b = bound
        self.strict = strict
        self.widen = widen
        self.types: dict[str, TensorType] = dict(bound.types)
        self.kernels: list[Block] = []
        self.temps: list[str] = []
        self._shapes: dict[str, TensorShape] = {}
        self._spaces: dict[tuple, tuple] = {}  # ``index_space``'s, by what decides them

    def index_space(
        self, c: TContraction, d: TContraction
    ) -> tuple[tuple[Index, ...], tuple[Affine, ...], dict]:
        """``_index_space(c, d)``, kept per lowering by what decides it: the accesses' polynomials
        and tensor sizes and the constraints, names of tensors aside. A long program repeats a few
        statements' index spaces over other tensors (1,000 matmuls: one), and each costs a
        Fourier-Motzkin projection in exact arithmetic (``tile.bounds``). Errors are not kept."""
        key = (tuple((a.polys, a.type.shape) for a in (d.output, *d.operands)),
               tuple((k.poly, k.bound) for k in d.constraints))
        found = self._spaces.get(key)
        if found is None:
            found = self._spaces[key] = _index_space(c, d)
        return found

    def shape(self, tensor: str) -> TensorShape:
        # A tensor's type never changes once known; long programs ask for each shape many times.
        shape = self._shapes.get(tensor)
        if shape is None:
            t = self.types[tensor]
            shape = self._shapes[tensor] = TensorShape.dense(t.dtype, tuple(int(d) for d in t.shape))
        return shape

    def temp(self, base: str, t: TensorType) -> str:
        name, k = base, 1
        while name in self.types:
            name, k = f"{base}_{k}", k + 1
        self.types[name] = t
        self.temps.append(name)
        return name

    def full_ref(self, tensor: str, direction: RefDir, agg: str = "") -> Refinement:
        shape = self.shape(tensor)
        return Refinement(direction, tensor, tuple(Affine() for _ in shape.dims), shape, agg_op=agg)

    def kernel(self, out: str, **fields) -> None:
        """A kernel writing ``out``, named by its place and its output (``k3_O``)."""
        self.kernels.append(Block(f"k{len(self.kernels)}_{out}", **fields))

    def special(self, fn: str, inputs: list[str], output: str, params: tuple[int, ...] = ()) -> None:
        refs = [self.full_ref(t, RefDir.IN) for t in dict.fromkeys(inputs)]
        refs.append(self.full_ref(output, RefDir.OUT, "assign"))
        stmt = Special(fn, tuple(inputs), (output,), params)
        self.kernel(output, refs=tuple(refs), stmts=(stmt,), tags=frozenset({"kernel", "special", fn}))


class _Elementwise(_Kernels):
    """Elementwise statements: a call of a special (``SPECIALS``) is a special kernel, its tensor
    arguments first computed into temporaries; any other expression is a kernel over the output's
    shape, its specials hoisted out into temporaries, its value computed by ``_ScalarCode``."""

    def assignment(self, out: str, expr: TExpr) -> None:
        expr = self.hoist(expr)
        if isinstance(expr, TCall) and expr.fn in SPECIALS:
            args = [self.materialize(a) for a in expr.args]
            self.special(expr.fn, args, out, expr.params)
            return
        shape = tuple(int(d) for d in self.types[out].shape)
        code = _ScalarCode(self, shape)
        value = code.scalar(expr)
        if isinstance(expr, (TRef, TConst)):
            value = code.emit("assign", (value,), self.types[out].dtype)
        out_ref = Refinement(
            RefDir.OUT,
            out,
            tuple(Affine.var(f"i{k}") for k in range(len(shape))),
            self.shape(out).scalar_view(),
            agg_op="assign",
        )
        code.stmts.append(Store(value, out))
        self.kernel(
            out,
            idxs=tuple(Index(f"i{k}", d) for k, d in enumerate(shape)),
            refs=(*code.refs.values(), out_ref),
            stmts=tuple(code.stmts),
            tags=frozenset({"kernel", "eltwise", *(f"eltwise_{f}" for f in sorted(code.fns))}),
        )

    def hoist(self, e: TExpr, root: bool = True) -> TExpr:
        """Special calls nested inside an expression become temporaries of their own."""
        if not isinstance(e, TCall):
            return e
        call = TCall(e.fn, tuple(self.hoist(a, False) for a in e.args), e.type, e.params, e.span)
        if not root and call.fn in SPECIALS:
            return TRef(self.materialize(call), call.type)
        return call

    def materialize(self, e: TExpr) -> str:
        """``e`` in a buffer: a tensor's own, or a temporary holding its value."""
        if isinstance(e, TRef):
            return e.name
        name = self.temp("T", e.type)
        self.assignment(name, e)
        return name


class _ScalarCode:
    """The statements of one elementwise kernel over an output of ``shape`` (indexes ``i0, i1,
    ..``): each tensor loaded once through a scalar view that broadcasts (a size-1 dim where the
    output's is not reads element 0), each operation an intrinsic into a fresh ``$t<k>``."""

    def __init__(self, kernels: _Kernels, shape: tuple[int, ...]):
        self.kernels = kernels
        self.shape = shape
        self.refs: dict[str, Refinement] = {}
        self.stmts: list = []
        self.fns: set[str] = set()  # the builtins used, for the kernel's tags

    def emit(self, fn: str, args: tuple[str, ...], dtype: DType, params: tuple[int, ...] = ()) -> str:
        """An ``Intrinsic`` into a fresh scalar, which it returns."""
        into = f"$t{len(self.stmts)}"
        self.stmts.append(Intrinsic(fn, args, (into,), dtype, params))
        return into

    def broadcast(self, sizes: tuple[int, ...], k: int) -> Affine:
        """The access of dim ``k`` of a tensor of ``sizes`` at the output's point."""
        pos = k + len(self.shape) - len(sizes)
        return Affine() if sizes[k] == 1 and self.shape[pos] != 1 else Affine.var(f"i{pos}")

    def scalar(self, e: TExpr) -> str:
        if isinstance(e, TRef) and e.name.startswith("$"):
            return e.name  # a scalar already computed (a composite's argument)
        if isinstance(e, TRef):
            return self.load(e.name)
        if isinstance(e, TConst):
            into = f"$t{len(self.stmts)}"
            self.stmts.append(_constant(into, e))
            return into
        if e.fn == "index":
            return self.index(e)
        args = tuple(self.scalar(a) for a in e.args)
        if e.fn in COMPOSITES:
            # the arguments computed once, then the builtins of its expansion over them
            slots = tuple(TRef(s, a.type) for s, a in zip(args, e.args, strict=True))
            return self.scalar(expand(TCall(e.fn, slots, e.type, e.params, e.span)))
        if e.fn.startswith("cmp_"):
            args = self.compared(e, args)
        self.fns.add(e.fn)
        return self.emit(e.fn, args, e.type.dtype, tuple(e.params))

    def load(self, tensor: str) -> str:
        if tensor not in self.refs:
            sizes = tuple(int(d) for d in self.kernels.types[tensor].shape)
            access = tuple(self.broadcast(sizes, k) for k in range(len(sizes)))
            view = self.kernels.shape(tensor).scalar_view()
            self.refs[tensor] = Refinement(RefDir.IN, tensor, access, view)
            self.stmts.append(Load(tensor, f"${tensor}"))
        return f"${tensor}"

    def index(self, e: TCall) -> str:
        """``index(T, axis)``: the output's coordinate along ``T``'s axis, as int32."""
        tsizes = tuple(int(d) for d in e.args[0].type.shape)
        into = f"$t{len(self.stmts)}"
        self.stmts.append(LoadIndex(self.broadcast(tsizes, e.params[0]), into))
        return self.emit("as_int", (into,), DType.INT32, (32,))

    def compared(self, e: TCall, args: tuple[str, ...]) -> tuple[str, ...]:
        """A comparison works in its operands' promoted Tile type. A float literal's scalar is a
        double (its exact value travels until used), but its Tile type is float32: so
        `X_f32 == 0.1` compares with float32(0.1). Convert such operands first."""
        common = promote(e.args[0].type.dtype, e.args[1].type.dtype)
        fixed = []
        for a, s in zip(e.args, args):
            if isinstance(a, TConst) and a.type.dtype.is_float and common is not DType.FLOAT64:
                s = self.emit("assign", (s,), common)
            fixed.append(s)
        return tuple(fixed)


class _Contractions(_Elementwise):
    """Contractions (see the module docstring): defracted, over their exact index box; the output
    written directly, or from the identity, or through an accumulator and a mask that a final
    elementwise select reads."""

    def contraction(self, c: TContraction) -> None:
        if self.widen and c.is_matrix_product and c.type.dtype.is_narrow_float and (
                self.widen != "unshaped" or not c.has_matrix_shape):
            self.widened(c)
            return
        self.aggregation(c)

    def widened(self, c: TContraction) -> None:
        """A float16/bfloat16 matrix product as the interpreter computes it: into a float32
        temporary (unwritten elements 0 or the default, both exact in float32), then rounded to
        the result type once, elementwise."""
        wide_type = TensorType(DType.FLOAT32, c.type.shape)
        wide = self.temp(f"{c.name}_f32", wide_type)
        self.aggregation(replace(c, name=wide, type=wide_type), operand_dtype=c.type.dtype)
        self.assignment(c.name, TRef(wide, wide_type))

    def aggregation(self, c: TContraction, operand_dtype: DType | None = None) -> None:
        """The kernels of ``c``; ``operand_dtype``: the type its operands are converted to before
        they are combined in ``c``'s own type (a widened product's: its result type's)."""
        out = c.name
        if _aggregates_nothing(c):
            self.init(out, c.default)  # nothing is aggregated: 0 or the default everywhere
            return
        d = transform(c, "defracted")
        idxs, constraints, shift = self.index_space(c, d)
        out_access = tuple(p.substitute(shift) for p in d.output.polys)
        target, mask = self.accumulator(c, out_access, idxs, constraints)
        refs, stmts = [], []
        loaded = []
        for k, acc in enumerate(d.operands):
            into = acc.tensor if all(a.tensor != acc.tensor for a in d.operands[:k]) else f"{acc.tensor}_{k}"
            refs.append(
                Refinement(
                    RefDir.IN,
                    into,
                    tuple(p.substitute(shift) for p in acc.polys),
                    self.shape(acc.tensor).scalar_view(),
                    from_=None if into == acc.tensor else acc.tensor,
                )
            )
            stmts.append(Load(into, f"${into}"))
            loaded.append(f"${into}")
            if operand_dtype is not None and self.types[acc.tensor].dtype is not operand_dtype:
                stmts.append(Intrinsic("assign", (loaded[-1],), (f"${into}_r",), operand_dtype))
                loaded[-1] = f"${into}_r"
        value = self.combine(c, loaded, stmts)
        refs.append(
            Refinement(RefDir.OUT, target, out_access, self.shape(target).scalar_view(), agg_op=_AGG[c.agg])
        )
        stmts.append(Store(value, target))
        if mask is not None:
            refs.append(
                Refinement(RefDir.OUT, mask, out_access, self.shape(mask).scalar_view(), agg_op="assign")
            )
            stmts.append(Constant("$one", 1, DType.BOOL))
            stmts.append(Store("$one", mask))
        self.kernel(
            out,
            idxs=idxs,
            constraints=constraints,
            refs=tuple(refs),
            stmts=tuple(stmts),
            tags=frozenset({"kernel", "contraction", f"agg_op_{_AGG[c.agg]}", f"comb_op_{_COMB[c.comb]}"}),
            comments=(format_contraction(d),),
        )
        if mask is not None:
            self.select(out, mask, target, c.default)

    def accumulator(
        self, c: TContraction, out_access: tuple[Affine, ...], idxs: tuple[Index, ...], constraints: tuple
    ) -> tuple[str, str | None]:
        """Where the contraction aggregates, started (by kernels before its own) so that unwritten
        elements end up 0 or the default: the output itself, or a temporary with a mask of the
        elements written (returned too)."""
        out = c.name
        direct = (c.agg is AggOp.SUM and c.default is None) or c.agg is AggOp.ASSIGN
        sizes = tuple(int(n) for n in c.type.shape)
        if direct:
            self.init(out, c.default if c.agg is AggOp.ASSIGN else None)
        elif not constraints and writes_every_element(out_access, idxs, sizes):
            # every element is written: it starts at the identity and no default shows
            self.special("zero" if c.agg is AggOp.SUM else f"agg_init_{_AGG[c.agg]}", [], out)
        else:
            target = self.temp(f"{out}_acc", c.type)
            mask = self.temp(f"{out}_written", TensorType(DType.BOOL, c.type.shape))
            self.special(f"agg_init_{_AGG[c.agg]}", [], target)
            self.special("zero", [], mask)
            return target, mask
        return out, None

    def combine(self, c: TContraction, loaded: list[str], stmts: list) -> str:
        dtype = c.type.dtype
        if c.comb is CombOp.NONE:
            stmts.append(Intrinsic("assign", (loaded[0],), ("$v",), dtype))
        elif c.comb in (CombOp.MUL, CombOp.ADD):
            stmts.append(Intrinsic(_COMB[c.comb], tuple(loaded), ("$v",), dtype))
        elif c.comb is CombOp.EQ:
            stmts.append(Intrinsic("cmp_eq", tuple(loaded), ("$eq",), DType.BOOL))
            stmts.append(Intrinsic("assign", ("$eq",), ("$v",), dtype))
        else:
            stmts.append(Intrinsic("cmp_eq", tuple(loaded[:2]), ("$eq",), DType.BOOL))
            stmts.append(Constant("$zero", 0, dtype))
            stmts.append(Intrinsic("cond", ("$eq", loaded[2], "$zero"), ("$v",), dtype))
        return "$v"

    def init(self, out: str, default: str | None) -> None:
        if default is None:
            self.special("zero", [], out)
        else:
            self.special("copy", [default], out)

    def select(self, out: str, mask: str, acc: str, default: str | None) -> None:
        """``out = mask ? acc : (default or 0)``, elementwise."""
        t = self.types[out]
        other: TExpr = TRef(default, self.types[default]) if default else TConst(0, TensorType(t.dtype, ()))
        expr = TCall("cond", (TRef(mask, self.types[mask]), TRef(acc, self.types[acc]), other), t)
        self.assignment(out, expr)


class _Lowering(_Contractions):
    """The whole program: each statement lowered in order, then the root block over every buffer
    (``#user`` inputs and outputs, ``#tmp`` the rest) and ``#main`` holding the kernels."""

    def program(self, name: str) -> Block:
        for stmt in self.b.stmts:
            if isinstance(stmt, TAssign):
                self.assignment(stmt.name, stmt.expr)
            else:
                self.contraction(stmt)
        inputs = [n for n, _ in self.b.inputs]
        outputs = list(self.b.outputs)
        buffers = [*inputs, *(s.name for s in self.b.stmts), *self.temps]
        root_refs, main_refs = [], []
        for t in buffers:
            role = {"user", "input"} if t in inputs else {"user", "output"} if t in outputs else {"tmp"}
            root_refs.append(
                Refinement(
                    RefDir.NONE,
                    t,
                    tuple(Affine() for _ in self.shape(t).dims),
                    self.shape(t),
                    tags=frozenset(role),
                )
            )
            direction = RefDir.IN if t in inputs else RefDir.OUT if t in outputs else RefDir.INOUT
            main_refs.append(self.full_ref(t, direction))
        main = Block("main", refs=tuple(main_refs), stmts=tuple(self.kernels), tags=frozenset({"main"}))
        return Block(name, refs=tuple(root_refs), stmts=(main,), tags=frozenset({"program"}))


def _aggregates_nothing(c: TContraction) -> bool:
    """An empty output or operand: no tuple is aggregated, whatever the index space."""
    return any(int(d) == 0 for d in c.type.shape) or any(
        any(int(d) == 0 for d in a.type.shape) for a in c.operands
    )


def check_index_space(c: TContraction) -> None:
    """Raise the error lowering ``c`` raises (an index space that no tuple is valid in, located
    as the interpreter locates it), without lowering it: for reporting a program's errors in
    statement order (``backends.driver.bind_inputs``)."""
    if not _aggregates_nothing(c):
        _index_space(c, transform(c, "defracted"))


def _refuse_integer_empty(c: TContraction) -> None:
    """Raise the interpreter's error for an index space whose rational box is not empty but holds
    no integer tuple (strides and offsets that step over every valid position: ``2*x + 3*k - 1``
    in ``[0, 1)``; the compiled program would answer the aggregation's identity). Only where a
    condition has a coefficient other than ±1 or a fraction, which is how such a space arises in
    practice; the look stops at the first valid tuple (``tile.tuples.Space.any_valid``)."""
    if not any(r.poly.denominator != 1 or any(abs(k) != 1 for _, k in r.poly.terms) for r in ranges(c)):
        return
    sp = space(c)
    if sp.any_valid() is False:
        sp.fail_empty()


def _index_space(c: TContraction, d: TContraction) -> tuple[tuple[Index, ...], tuple[Affine, ...], dict]:
    """The indexes of ``d`` (``c`` defracted) over their exact box shifted to start at 0, the
    constraints the box does not imply, and the shift (each index's affine in the shifted ones)."""
    box = plain_box(d)  # every condition one index and an integer: the box implies them all
    plain = box is not None
    if box is None:
        try:
            box = index_box(d)
        except TileIndexError:
            # The defracted form has lost the source's conditions: name, as the interpreter does,
            # the written one that empties the index space (it is empty too).
            space(c).fail_empty()
            raise
    _refuse_integer_empty(c)
    names = list(d.index_names)
    shift = {v: Affine.var(v) + box[v][0] for v in names}
    # in the interpreter's order (first appearance, output first): its row-major enumeration
    # is the order each element receives its values, which strict mode keeps (semantics §8.3)
    idxs = tuple(Index(v, box[v][1] - box[v][0] + 1) for v in names)
    if plain:
        return idxs, (), shift
    shifted = {v: (0, box[v][1] - box[v][0]) for v in names}
    constraints = []
    for r in merge_parallel(ranges(d)):
        q = r.poly.substitute(shift)
        lo, hi = poly_interval(q, shifted)
        if lo < r.lo:
            constraints.append(q - r.lo)
        if hi > r.hi:
            constraints.append(Affine.constant(r.hi) - q)
    return idxs, tuple(constraints), shift


def _constant(into: str, e: TConst) -> Constant:
    v = e.value
    if e.type.dtype.is_float:
        return Constant(into, float(Fraction(v)), DType.FLOAT64)  # the nearest double, as the interpreter
    return Constant(into, int(v), e.type.dtype)


def writes_every_element(
    access: tuple[Affine, ...], idxs: tuple[Index, ...], sizes: tuple[int, ...]
) -> bool:
    """Whether ``access`` over every point of ``idxs`` (no constraints) reaches every element of an
    output of ``sizes``: each dim's ``const + Σ coeff·index`` numbers ``[0, size)`` as a mixed radix
    (the sorted ``|coeff|`` are 1, r1, r1·r2, ... with the ranges multiplying to the size, the least
    value 0), and no index appears in two dims. Conservative: False where unsure."""
    ranges = {ix.name: ix.range for ix in idxs}
    seen: set[str] = set()
    for poly, size in zip(access, sizes, strict=True):
        terms = [(abs(c), ranges[v]) for v, c in poly.terms if ranges[v] > 1]
        if seen & set(poly.vars):
            return False
        seen |= set(poly.vars)
        low = poly.const + sum(min(c, 0) * (ranges[v] - 1) for v, c in poly.terms)
        expect = 1
        for coeff, rng in sorted(terms):
            if coeff != expect:
                return False
            expect *= rng
        if low != 0 or expect != size:
            return False
    return True
