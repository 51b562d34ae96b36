"""Typing elementwise expressions: literals, names (a tensor, or a compile-time integer as a
constant), operators and builtin calls, each call typed by its builtin's rule (``tile.builtins``)
from its tensor arguments' types and its compile-time parameters."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from tile import ast
from tile.binding.scope import Scope
from tile.builtins import BUILTINS, VALUE_FREE_PARAMS
from tile.dtypes import DType, literal_int_type
from tile.errors import Span, TileNameError, TileTypeError, unknown_function
from tile.printer import format_expr
from tile.shapes import is_concrete
from tile.typed import Size, TCall, TConst, TensorType, TExpr, TRef


class Elementwise:
    def __init__(self, scope: Scope):
        self.scope = scope

    def expr(self, e: ast.Expr) -> TExpr:
        scope = self.scope
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
            if e.name in scope.types and e.name not in scope.size_uses:
                return TRef(e.name, scope.types[e.name], e.span)
            if e.name in scope.consts:
                v = scope.consts[e.name]
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
            raise scope.unknown(e.name, e.span)
        if isinstance(e, ast.Unary):
            return self.call(e.span, ast.UNARY_FUNCTIONS[e.op], [e.operand])
        if isinstance(e, ast.Binary):
            return self.call(e.span, ast.BINARY_FUNCTIONS[e.op], [e.lhs, e.rhs])
        if isinstance(e, ast.Ternary):
            return self.call(e.span, "cond", [e.cond, e.then, e.other])
        if isinstance(e, ast.Call):
            return self.call(e.span, e.fn, list(e.args))
        raise AssertionError(f"unknown expression {e!r}")

    def call(self, span: Span, fn: str, args: list[ast.Expr]) -> TExpr:
        b = BUILTINS.get(fn)
        if b is None:
            raise unknown_function(fn, span, BUILTINS)
        nparams_ok = b.params < 0 or len(args) - b.tensors == b.params  # -1: any number of them
        if len(args) < b.tensors or not nparams_ok:
            want = b.tensors + max(b.params, 0)
            more = " or more" if b.params < 0 else ""
            raise TileTypeError(f"'{fn}' takes {want}{more} argument(s), got {len(args)}", span, hint=b.doc)
        targs = [self.expr(a) for a in args[: b.tensors]]
        if fn in VALUE_FREE_PARAMS:
            params = [self.value_free(a, fn) for a in args[b.tensors :]]
        else:
            params = [self.scope.const(a, f"an argument of '{fn}'") for a in args[b.tensors :]]
        names = _Described(args[: b.tensors])
        rtype = b.rule([t.type for t in targs], params, span, names, self.scope.notes)
        return TCall(fn, tuple(targs), rtype, tuple(params), span)

    def value_free(self, e: ast.Expr, fn: str) -> Size:
        """An argument that changes no value of ``fn`` (``VALUE_FREE_PARAMS``): a compile-time
        integer is kept as it is; any other expression PlaidML accepts (a 0-D tensor computed from
        dimensions, say) is typed, checked to be a numeric scalar, and then stands as 0."""
        try:
            return self.scope.const(e, f"an argument of '{fn}'")
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


class _Described(Sequence[str]):
    """The operands' source text, for the typing rules' error messages: formatted only when a
    message asks for it (formatting every operand of every call up front made binding quadratic in
    the depth of an expression: 4 s for a 64-deep product's second gradient)."""

    def __init__(self, exprs: Sequence[ast.Expr]):
        self.exprs = exprs

    def __len__(self) -> int:
        return len(self.exprs)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [format_expr(e) for e in self.exprs[i]]
        return format_expr(self.exprs[i])
