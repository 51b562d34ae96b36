"""Binding: names, shapes and dtypes of a program given its inputs' types.

``bind(program, {name: TensorType})`` checks every rule that needs sizes (ranks, dimension
agreement, broadcasting, linear index polynomials, output sizes) and returns the typed program.
``bind_symbolic(program)`` does the same with one sympy symbol per input dimension, for
``python -m tile check`` without ``--shape``. A 0-D input used as a size (``tile.size_inputs``) is
a dimension whose value comes from its array: ``bind`` reads it from ``values``, and without one
(always in ``bind_symbolic``) it is a symbol too.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from fractions import Fraction

import sympy

from tile import ast
from tile.affine import Affine
from tile.asserts import check_assert, is_assert
from tile.bounds import check_bounded
from tile.builtins import BUILTINS, VALUE_FREE_PARAMS
from tile.dtypes import DType, arithmetic, literal_int_type, promote
from tile.errors import Span, TileIndexError, TileInputError, TileNameError, TileShapeError, TileTypeError
from tile.gc_pause import paused_gc
from tile.prng import pair_prng, state_inputs
from tile.shapes import fmt_shape, is_concrete, same_size, size_binop
from tile.simple_reduce import as_contraction, is_simple_reduce
from tile.size_inputs import size_uses, size_value
from tile.typed import (
    BoundProgram,
    Size,
    TAccess,
    TAssign,
    TCall,
    TConst,
    TConstraint,
    TContraction,
    TensorType,
    TExpr,
    TRef,
    TStatement,
)

_SCALAR_I32 = TensorType(DType.INT32, ())


@paused_gc()  # a long program is hundreds of thousands of objects: no cycle hunts meanwhile
def bind(
    program: ast.Program, inputs: Mapping[str, TensorType], values: Mapping[str, object] | None = None
) -> BoundProgram:
    """Type ``program`` for inputs of the given types; every input must be given.

    ``values`` holds the arrays (or numbers) of the inputs, of which only the 0-D inputs used as
    sizes are read: their values are sizes, so they are part of the typed program. A size input
    missing from ``values`` gets a symbolic size.
    """
    return _Binder(program, inputs, values).run()


def bind_symbolic(
    program: ast.Program,
    dtypes: Mapping[str, DType] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> BoundProgram:
    """Type ``program`` with symbolic sizes (sympy) for inputs whose shape is not given.

    Inputs default to float32 (int32 when used as a size, uint32 when a PRNG state). An input
    declared without dims and without a given shape has an unknown rank; results depending on it
    elementwise have an unknown shape.
    """
    dtypes = dict(dtypes or {})
    shapes = dict(shapes or {})
    sizes = size_uses(program)
    for name in sizes:
        dtypes.setdefault(name, DType.INT32)  # a size is a whole number
    for name in state_inputs(program):
        dtypes.setdefault(name, DType.UINT32)  # a PRNG state is uint32
    known: dict[str, int] = {}  # dims fixed by the inputs whose shapes are given
    for inp in program.inputs:
        if inp.name in shapes and inp.dims is not None and len(inp.dims) == len(shapes[inp.name]):
            for d, size in zip(inp.dims, shapes[inp.name]):
                known.setdefault(d, int(size))
    types: dict[str, TensorType] = {}
    for inp in program.inputs:
        dt = dtypes.get(inp.name, DType.FLOAT32)
        if inp.name in shapes:
            types[inp.name] = TensorType(dt, tuple(shapes[inp.name]))
        elif inp.dims is None:
            types[inp.name] = TensorType(dt, None)
        else:
            types[inp.name] = TensorType(
                dt, tuple(known.get(d, sympy.Symbol(d, positive=True, integer=True)) for d in inp.dims)
            )
    # A size input naming a dimension that a given shape fixes has that value (`function (S, A[S])`).
    return _Binder(program, types, {n: known[n] for n in sizes if n in known}).run()


class _Binder:
    def __init__(
        self,
        program: ast.Program,
        inputs: Mapping[str, TensorType],
        values: Mapping[str, object] | None = None,
    ):
        self.program = program
        self.given = inputs
        self.values = values or {}
        self.size_uses = size_uses(program)
        self.types: dict[str, TensorType] = {}
        self.consts: dict[str, Size] = {}
        self.defined: dict[str, Span] = {}
        self.notes: list[str] = []
        self.later = {s.name: s.span for s in program.stmts}

    # --------------------------------------------------------------------- driver
    def run(self) -> BoundProgram:
        inputs = tuple((inp.name, self.bind_input(inp)) for inp in self.program.inputs)
        stmts: list[TStatement] = []
        for stmt in self.program.stmts:
            self.check_new_name(
                stmt.name, stmt.output.span if isinstance(stmt, ast.Contraction) else stmt.span
            )
            if isinstance(stmt, ast.Assignment):
                bound: TStatement = self.assignment(stmt)
            else:
                bound = self.contraction(stmt)
            stmts.append(bound)
            self.types[stmt.name] = bound.type
            self.defined[stmt.name] = stmt.span
        outputs = []
        for out in self.program.outputs:
            if out.name in self.given:
                raise TileNameError(
                    f"output '{out.name}' is an input",
                    out.span,
                    hint=f"outputs are computed: write `Out = {out.name};` and return Out",
                )
            if out.name not in self.types:
                raise TileNameError(
                    f"output '{out.name}' is never computed",
                    out.span,
                    hint=f"add a statement `{out.name} = ...;` to the function body",
                )
            if out.name in outputs:
                raise TileNameError(
                    f"output '{out.name}' is listed twice",
                    out.span,
                    hint="list each output once in `-> (...)`",
                )
            outputs.append(out.name)
        return BoundProgram(
            self.program,
            inputs,
            pair_prng(stmts, [(o.name, o.span) for o in self.program.outputs]),
            tuple(outputs),
            dict(self.types),
            dict(self.consts),
            tuple(self.notes),
        )

    def check_new_name(self, name: str, span: Span) -> None:
        if name in self.defined or name in self.consts:
            where = self.defined.get(name)
            at = f" (first defined at line {where.line})" if where is not None and where.line else ""
            raise TileNameError(
                f"'{name}' is already defined{at}",
                span,
                hint="Tile values are immutable: give the new value a new name",
            )
        if name[0].islower():
            raise TileNameError(
                f"'{name}' must start with an upper-case letter",
                span,
                hint=f"tensor names start with an upper-case letter: '{name.capitalize()}'",
            )

    def bind_input(self, inp: ast.Input) -> TensorType:
        # A size input is a dimension: an earlier input may have a dimension of its name (the two
        # must then agree, which size_input checks), as gradient programs declare `DI[N, D0, CI]`.
        dim_first = inp.name in self.size_uses and inp.name not in self.defined
        if inp.name in self.defined or (inp.name in self.consts and not dim_first):
            raise TileNameError(
                f"'{inp.name}' is already defined",
                inp.span,
                hint="each input and dimension needs its own name",
            )
        if inp.name not in self.given:
            raise TileInputError(
                f"no value given for input '{inp.name}'", inp.span, hint="pass an array for every input"
            )
        t = self.given[inp.name]
        self.defined[inp.name] = inp.span
        if inp.dims is not None:
            if t.shape is not None and len(t.shape) != len(inp.dims):
                raise TileInputError(
                    f"input '{inp.name}' is declared with {len(inp.dims)} dimension(s) "
                    f"[{', '.join(inp.dims)}] but the given array has shape {fmt_shape(t.shape)}",
                    inp.span,
                    hint="pass an array of the declared rank, or fix the declaration",
                )
            for k, (dim, dspan) in enumerate(zip(inp.dims, inp.dim_spans or [inp.span] * len(inp.dims))):
                if dim in self.defined and dim not in self.size_uses:
                    raise TileNameError(
                        f"dimension '{dim}' has the name of a tensor",
                        dspan,
                        hint="tensors and dimensions need different names",
                    )
                size = t.shape[k] if t.shape is not None else sympy.Symbol(dim, positive=True, integer=True)
                if dim in self.consts:
                    if not same_size(self.consts[dim], size):
                        raise TileInputError(
                            f"dimension '{dim}' is {self.consts[dim]} from an earlier input but "
                            f"{size} in '{inp.name}' (shape {fmt_shape(t.shape)})",
                            dspan,
                            hint=f"inputs sharing the dimension name '{dim}' must have equal sizes there",
                        )
                else:
                    self.consts[dim] = size
        if inp.name in self.size_uses:
            t = self.size_input(inp, t)
        self.types[inp.name] = t
        return t

    def size_input(self, inp: ast.Input, t: TensorType) -> TensorType:
        """Make the 0-D input ``inp``, used as a size, a dimension holding its array's value."""
        use = self.size_uses[inp.name]
        if t.shape is None:  # symbolic check of an input declared without dims: a size is 0-D
            t = TensorType(t.dtype, ())
        if t.shape != ():
            raise TileShapeError(
                f"input '{inp.name}' is used as a size ({use.what}) but has shape {fmt_shape(t.shape)}",
                use.span,
                hint=f"only a 0-D input can be a size: declare '{inp.name}' without dimensions and pass "
                "one number (e.g. np.int32(8)), or use a dimension of another input",
            )
        if inp.name in self.values:
            size: Size = size_value(inp.name, self.values[inp.name], use, inp.span)
        else:
            size = sympy.Symbol(inp.name, positive=True, integer=True)  # as a dimension's
        if inp.name in self.consts and not same_size(self.consts[inp.name], size):
            raise TileInputError(
                f"input '{inp.name}' holds {size} but is {self.consts[inp.name]} as a dimension of an "
                "earlier input",
                inp.span,
                hint=f"a dimension named like the size input '{inp.name}' must have its value",
            )
        self.consts[inp.name] = size
        return t

    # ----------------------------------------------------------------- statements
    def assignment(self, stmt: ast.Assignment) -> TAssign | TContraction:
        if is_simple_reduce(stmt.expr):
            size = lambda e: self.const(e, "a size of simple_reduce")  # noqa: E731
            return self.contraction(as_contraction(stmt, self.lookup_tensor, size, self.notes))
        if is_assert(stmt.expr):
            value = check_assert(stmt.expr, lambda e: self.const(e, "an assertion"), self.notes)
            self.consts[stmt.name] = value.value
            return TAssign(stmt.name, value, stmt.span)
        expr = self.expr(stmt.expr)
        if expr.type.dtype.is_int and expr.type.shape == ():
            value = self.try_const(stmt.expr)
            if value is not None:
                # The constant is the value its integer tensor holds, wrap-around included.
                self.consts[stmt.name] = _wrap(value, expr.type.dtype) if is_concrete(value) else value
        return TAssign(stmt.name, expr, stmt.span)

    def contraction(self, c: ast.Contraction) -> TContraction:
        self.placeholder_used = False
        out = c.output
        if c.sizes is None:
            raise TileShapeError(
                f"the size of '{out.name}' is missing",
                out.span,
                hint=f"give one size per index after a colon, e.g. `{out.name}[i, j: M, N]`",
            )
        if len(c.sizes) != len(out.indices):
            raise TileShapeError(
                f"'{out.name}' has {len(out.indices)} index(es) but {len(c.sizes)} size(s)",
                out.span,
                hint="give exactly one size per output index",
            )
        sizes = []
        for s in c.sizes:
            v = self.const(s, "an output size")
            if is_concrete(v) and v < 0:
                raise TileShapeError(
                    f"output size {v} is negative",
                    s.span,
                    hint="sizes are non-negative integer expressions of dimensions",
                )
            sizes.append(v)
        shape = tuple(sizes)
        operands = tuple(self.access(r) for r in c.operands)
        dtypes = [a.type.dtype for a in operands]
        if c.comb is ast.CombOp.NONE:
            dtype = dtypes[0]
        elif c.comb is ast.CombOp.EQ:
            dtype = DType.BOOL
        elif c.comb is ast.CombOp.COND:
            dtype = dtypes[2]
        else:
            dtype = promote(dtypes[0], dtypes[1])
        if c.agg in (ast.AggOp.SUM, ast.AggOp.PROD):
            dtype = arithmetic(dtype)
        otype = TensorType(dtype, shape)
        output = TAccess(
            out.name,
            tuple(self.poly(i) for i in out.indices),
            otype,
            out.span,
            tuple(i.span for i in out.indices),
        )
        constraints = tuple(
            TConstraint(self.poly(k.poly), self.const(k.bound, "a constraint bound"), k.span)
            for k in c.constraints
        )
        used = {v for a in (output, *operands) for p in a.polys for v in p.vars}
        for k, tk in zip(c.constraints, constraints):
            for v in tk.poly.vars:
                if v not in used:
                    raise TileIndexError(
                        f"index '{v}' appears only in a constraint",
                        _find_name(k.poly, v) or k.span,
                        hint=f"use '{v}' in a tensor index, or remove the constraint",
                    )
        if c.default is not None:
            dt = self.lookup_tensor(c.default, c.default_span)
            if dt.shape is not None and not (
                len(dt.shape) == len(shape) and all(same_size(a, b) for a, b in zip(dt.shape, shape))
            ):
                raise TileShapeError(
                    f"default tensor '{c.default}' has shape {fmt_shape(dt.shape)} but "
                    f"'{out.name}' has shape {fmt_shape(shape)}",
                    c.default_span,
                    hint="the default must have exactly the output's shape",
                )
        bound = TContraction(
            out.name, otype, c.agg, c.comb, output, operands, constraints, c.default, c.no_defract, c.span, c
        )
        if not self.placeholder_used:
            check_bounded(bound)
        return bound

    def access(self, ref: ast.TensorRef) -> TAccess:
        t = self.lookup_tensor(ref.name, ref.span)
        if t.shape is not None and len(t.shape) != len(ref.indices):
            raise TileShapeError(
                f"'{ref.name}' has rank {len(t.shape)} but is indexed with {len(ref.indices)} index(es)",
                ref.span,
                hint=f"{ref.name} has shape {fmt_shape(t.shape)}; give one index per dimension",
            )
        if t.shape is None:  # rank learned from this use (symbolic check of an input without dims)
            t = TensorType(
                t.dtype,
                tuple(
                    sympy.Symbol(f"{ref.name}.{k}", positive=True, integer=True)
                    for k in range(len(ref.indices))
                ),
            )
            self.types[ref.name] = t
        return TAccess(
            ref.name,
            tuple(self.poly(i) for i in ref.indices),
            t,
            ref.span,
            tuple(i.span for i in ref.indices),
        )

    # -------------------------------------------------------------------- lookups
    def lookup_tensor(self, name: str, span: Span) -> TensorType:
        if name in self.types:
            return self.types[name]
        if name in self.consts:
            raise TileTypeError(
                f"'{name}' is a dimension, not a tensor",
                span,
                hint="dimensions can be used in sizes, index expressions and elementwise code",
            )
        raise self.unknown(name, span)

    def unknown(self, name: str, span: Span) -> TileNameError:
        if name in self.later:
            return TileNameError(
                f"'{name}' is used before it is defined (line {self.later[name].line})",
                span,
                hint="statements run in order; move the definition up",
            )
        known = list(self.types) + list(self.consts)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "declare it as an input or define it first"
        return TileNameError(f"unknown name '{name}'", span, hint=hint)

    # -------------------------------------------------------- compile-time integers
    def try_const(self, e: ast.Expr) -> Size | None:
        try:
            return self.const(e, "")
        except (TileTypeError, TileNameError):
            return None

    def value_free(self, e: ast.Expr, fn: str) -> Size:
        """An argument that changes no value of ``fn`` (``VALUE_FREE_PARAMS``): a compile-time
        integer is kept as it is; any other expression PlaidML accepts (a 0-D tensor computed from
        dimensions, say) is typed, checked to be a numeric scalar, and then stands as 0."""
        try:
            return self.const(e, f"an argument of '{fn}'")
        except TileTypeError:
            pass
        t = self.expr(e).type
        if t.shape is not None and len(t.shape) != 0:
            raise TileTypeError(
                f"the last argument of '{fn}' must be a scalar, not a {t}",
                e.span,
                hint="pass the element count as a number, a dimension or a 0-D tensor; it changes no value",
            )
        if t.dtype is DType.BOOL:
            raise TileTypeError(
                f"the last argument of '{fn}' must be a number, not a {t}",
                e.span,
                hint="pass the element count as a number, a dimension or a 0-D tensor; it changes no value",
            )
        return 0

    def const(self, e: ast.Expr, what: str) -> Size:
        """An integer expression of dimensions and integer constants; ``/`` truncates."""
        if isinstance(e, ast.IntLit):
            return e.value
        if isinstance(e, ast.Name):
            if e.name in self.consts:
                return self.consts[e.name]
            if e.is_index:
                raise TileTypeError(
                    f"index '{e.name}' cannot be used in {what}",
                    e.span,
                    hint="sizes and bounds are built from dimensions and integers",
                )
            if e.name in self.types:
                raise TileTypeError(
                    f"tensor '{e.name}' cannot be used in {what}",
                    e.span,
                    hint="only dimensions and integer constants are known at compile time",
                )
            raise self.unknown(e.name, e.span)
        if isinstance(e, ast.Unary) and e.op == "-":
            return size_binop("-", 0, self.const(e.operand, what))
        if isinstance(e, ast.Binary) and e.op in "+-*/":
            return size_binop(e.op, self.const(e.lhs, what), self.const(e.rhs, what))
        if isinstance(e, ast.Call) and e.fn in ("max", "min") and len(e.args) == 2:
            return size_binop(e.fn, self.const(e.args[0], what), self.const(e.args[1], what))
        raise TileTypeError(
            f"{what or 'this'} must be an integer expression of dimensions",
            e.span,
            hint="use integers, dimensions, + - * / (truncating), max and min",
        )

    # --------------------------------------------------------- index polynomials
    def poly(self, e: ast.Expr) -> Affine:
        """An exact affine polynomial in index variables; ``/`` is exact (``i/2`` is a half)."""
        if isinstance(e, ast.IntLit):
            return Affine.constant(e.value)
        if isinstance(e, ast.Name):
            if e.is_index:
                return Affine.var(e.name)
            v = self.const(e, "an index polynomial")
            if is_concrete(v):
                return Affine.constant(v)
            self.placeholder_used = True  # symbolic: only linearity can be checked
            return Affine.constant(1)
        if isinstance(e, ast.Unary) and e.op == "-":
            return -self.poly(e.operand)
        if isinstance(e, ast.Binary) and e.op in "+-":
            a, b = self.poly(e.lhs), self.poly(e.rhs)
            return a + b if e.op == "+" else a - b
        if isinstance(e, ast.Binary) and e.op == "*":
            a, b = self.poly(e.lhs), self.poly(e.rhs)
            if not a.is_constant and not b.is_constant:
                raise TileIndexError(
                    "non-linear index polynomial",
                    e.span,
                    hint="index expressions are affine: multiply an index only by a constant",
                )
            return a * b.const if b.is_constant else b * a.const
        if isinstance(e, ast.Binary) and e.op == "/":
            a, b = self.poly(e.lhs), self.poly(e.rhs)
            if not b.is_constant:
                raise TileIndexError(
                    "division by an index variable",
                    e.rhs.span,
                    hint="index expressions may only be divided by constants",
                )
            if b.const == 0:
                raise TileIndexError(
                    "division by zero in an index polynomial",
                    e.rhs.span,
                    hint="divide index expressions by non-zero constants only",
                )
            return a / b.const
        if isinstance(e, ast.FloatLit):
            raise TileTypeError(
                "float constant in an index expression",
                e.span,
                hint="index coefficients are integers or exact fractions like 1/2",
            )
        raise TileIndexError(
            "not allowed in an index polynomial",
            e.span,
            hint="index expressions use + - * / on indices, integers and dimensions",
        )

    # ---------------------------------------------------------- elementwise code
    def expr(self, e: ast.Expr) -> TExpr:
        if isinstance(e, ast.IntLit):
            if not -(2**63) <= e.value < 2**63:
                raise TileTypeError(
                    f"integer literal {e.value} does not fit in int64",
                    e.span,
                    hint="integer literals are int32, or int64 when larger",
                )
            return TConst(e.value, TensorType(literal_int_type(e.value), ()), e.span)
        if isinstance(e, ast.FloatLit):
            return TConst(Fraction(e.text), TensorType(DType.FLOAT32, ()), e.span)
        if isinstance(e, ast.Name):
            if e.name in self.types and e.name not in self.size_uses:
                return TRef(e.name, self.types[e.name], e.span)
            if e.name in self.consts:
                v = self.consts[e.name]
                return TConst(
                    v, TensorType(literal_int_type(v) if is_concrete(v) else DType.INT32, ()), e.span
                )
            if e.is_index:
                raise TileNameError(
                    f"index '{e.name}' used outside a contraction",
                    e.span,
                    hint="index variables only exist inside `O[...] = op(...)` statements; "
                    "use index(T, axis) for coordinates",
                )
            raise self.unknown(e.name, e.span)
        if isinstance(e, ast.Unary):
            return self.call(e.span, ast.UNARY_FUNCTIONS[e.op], [e.operand], e.span)
        if isinstance(e, ast.Binary):
            return self.call(e.span, ast.BINARY_FUNCTIONS[e.op], [e.lhs, e.rhs], e.span)
        if isinstance(e, ast.Ternary):
            return self.call(e.span, "cond", [e.cond, e.then, e.other], e.span)
        if isinstance(e, ast.Call):
            return self.call(e.span, e.fn, list(e.args), e.span)
        raise AssertionError(f"unknown expression {e!r}")

    def call(self, span: Span, fn: str, args: list[ast.Expr], where: Span) -> TExpr:
        b = BUILTINS.get(fn)
        if b is None:
            close = difflib.get_close_matches(fn, list(BUILTINS), n=1)
            raise TileNameError(
                f"unknown function '{fn}'",
                span,
                hint=f"did you mean '{close[0]}'?" if close else "see docs/semantics.md for the builtins",
            )
        nparams_ok = b.params < 0 or len(args) - b.tensors == b.params  # -1: any number of them
        if len(args) < b.tensors or not nparams_ok:
            want = b.tensors + max(b.params, 0)
            more = " or more" if b.params < 0 else ""
            raise TileTypeError(f"'{fn}' takes {want}{more} argument(s), got {len(args)}", span, hint=b.doc)
        targs = [self.expr(a) for a in args[: b.tensors]]
        if fn in VALUE_FREE_PARAMS:
            params = [self.value_free(a, fn) for a in args[b.tensors :]]
        else:
            params = [self.const(a, f"an argument of '{fn}'") for a in args[b.tensors :]]
        names = _Described(args[: b.tensors])
        rtype = b.rule([t.type for t in targs], params, span, names, self.notes)
        return TCall(fn, tuple(targs), rtype, tuple(params), span)


class _Described(Sequence[str]):
    """The operands' source text, for the typing rules' error messages: formatted only when a
    message asks for it (formatting every operand of every call up front made binding quadratic in
    the depth of an expression: 4 s for a 64-deep product's second gradient)."""

    def __init__(self, exprs: Sequence[ast.Expr]):
        self.exprs = exprs

    def __len__(self) -> int:
        return len(self.exprs)

    def __getitem__(self, i):  # type: ignore[override]
        from tile.printer import format_expr

        if isinstance(i, slice):
            return [format_expr(e) for e in self.exprs[i]]
        return format_expr(self.exprs[i])


def _wrap(value: int, dtype: DType) -> int:
    mod = 1 << dtype.bits
    v = value % mod
    return v - mod if dtype.is_signed and v >= mod >> 1 else v


def _find_name(e: ast.Expr, name: str) -> Span | None:
    """The span of the first use of ``name`` inside ``e``."""
    if isinstance(e, ast.Name):
        return e.span if e.name == name else None
    children: tuple = ()
    if isinstance(e, ast.Binary):
        children = (e.lhs, e.rhs)
    elif isinstance(e, ast.Unary):
        children = (e.operand,)
    elif isinstance(e, ast.Call):
        children = e.args
    elif isinstance(e, ast.Ternary):
        children = (e.cond, e.then, e.other)
    for c in children:
        s = _find_name(c, name)
        if s is not None:
            return s
    return None
