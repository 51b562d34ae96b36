"""The documented differences from PlaidML 0.7 (docs/semantics.md §10) that a program can show.

One copy, for two users: ``PlaidMLDevice.known_difference`` (a conformance example that fails on
PlaidML for a documented reason is an expected failure) and the differential peer tests
(``conformance/test_plaidml_peer*.py``), which assert each of them as a named case.

Each finding is a ``Difference``: its text names the section ("semantics §10.8: ...") and ``shows``
says how it surfaces on PlaidML, so a reason is given only for a failure it can explain (an abort
is not explained by a float literal rounded to float32). The functions read a typed program
(``tile.typed``) and, where a difference depends on values, ``values``: every tensor by name,
inputs and statements (``everything``); without values such a difference counts as possible.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy

from tile import ast
from tile.affine import Affine
from tile.dtypes import DType, promote_all
from tile.errors import TileError
from tile.typed import BoundProgram, TAssign, TCall, TConst, TContraction, TExpr, TRef, calls

ABORT, HANG, ERROR, VALUES, DTYPE = "abort", "hang", "error", "values", "dtype"


@dataclass(frozen=True)
class Difference:
    """One documented difference a program shows: ``section`` of docs/semantics.md ("10.8"),
    ``what`` happens, and ``shows``, the outcomes on PlaidML it explains (``ABORT`` ...)."""

    section: str
    what: str
    shows: frozenset[str]

    def __str__(self) -> str:
        return f"semantics §{self.section}: {self.what}"


def _d(section: str, what: str, *shows: str) -> Difference:
    return Difference(section, what, frozenset(shows))


# ------------------------------------------------------------------------------ contractions


def identity(agg: ast.AggOp, dtype: np.dtype):
    """What PlaidML leaves at positions inside the output range that no tuple writes (§10.1)."""
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return {">": info.min, "<": info.max, "*": 1}.get(agg.value, 0)


def written(c: TContraction) -> np.ndarray:
    """Which elements of ``c``'s output (concrete shapes) some valid index tuple writes."""
    from tile.tuples import blocks, space

    size = math.prod(c.type.shape)
    mask = np.zeros(size, bool)
    if size:
        for b in blocks(space(c), accesses=1):
            mask[b.flats[0]] = True
    return mask.reshape(c.type.shape)


def contraction_differences(c: TContraction) -> list[Difference]:
    """What PlaidML does otherwise on this contraction, from its types alone."""
    dtype, found = c.type.dtype, []
    if c.comb == ast.CombOp.EQ:
        found.append(_d("10.8", "a bare `A == B` combination aborts PlaidML", ABORT))
    if c.agg == ast.AggOp.MIN and dtype.numpy.kind == "u":
        found.append(_d("10.30", "`<` aggregation of unsigned integers gives 0 in PlaidML", VALUES))
    if c.agg in (ast.AggOp.MAX, ast.AggOp.MIN) and dtype.numpy == np.float16:
        found.append(_d("10.31", "`>`/`<` aggregation of float16 aborts PlaidML", ABORT))
    if c.agg != ast.AggOp.ASSIGN and any(o.type.dtype.numpy.kind == "b" for o in c.operands):
        found.append(_d("10.41", "aggregating bools aborts PlaidML (`+` counts them as int32 here)", ABORT))
    if c.comb == ast.CombOp.COND and promote_all([o.type.dtype for o in c.operands]) != dtype:
        found.append(
            _d("10.40", "`A == B ? C` has the common type of A, B and C in PlaidML, not C's", VALUES, DTYPE)
        )
    if 0 in c.type.shape:
        found.append(_d("10.6", "a contraction with an output of 0 elements aborts PlaidML", ABORT))
    names = [a.tensor for a in c.operands]
    if any(names.count(n) > 1 and len({a.polys for a in c.operands if a.tensor == n}) > 1 for n in names):
        found.append(
            _d(
                "10",
                "PlaidML 0.7 bug: a tensor used twice in one contraction is read with the first "
                "use's indices",
                VALUES,
            )
        )
    return found


def pins_a_combination(c: TContraction) -> bool:
    """Whether an operand dimension of size 1 holds a polynomial of several indices (§10.37)."""
    return any(size == 1 and len(p.vars) > 1 for a in c.operands for size, p in zip(a.type.shape, a.polys))


def lattice_index(c: TContraction) -> int:
    """The gcd of the maximal minors of the coefficients of the index polynomials and of the plain
    range constraints (``i < N``): 1 when they are unimodular, 0 for rational coefficients (§10.37)."""
    names = c.index_names
    ranges = [k.poly for k in c.constraints if len(k.poly.vars) == 1 and k.poly == Affine.var(k.poly.vars[0])]
    polys = [p for acc in (c.output, *c.operands) for p in acc.polys] + ranges
    rows = [[p.coeff(v) for v in names] for p in polys if not p.is_constant]
    if any(x.denominator != 1 for r in rows for x in r):
        return 0
    g = 0
    for pick in itertools.combinations(rows, len(names)):
        g = math.gcd(g, int(round(sympy.Matrix(pick).det())))
    return g


def unimodular_abort(c: TContraction) -> Difference | None:
    """§10.37: PlaidML may abort on a valid contraction that is not unimodular or that pins a
    combination of indices (not every such one aborts: an explanation of an abort only)."""
    if lattice_index(c) != 1 or pins_a_combination(c):
        return _d("10.37", "PlaidML aborts on some valid contractions (not unimodular, or pinned)", ABORT)
    return None


# ------------------------------------------------------------------------------ elementwise

FLOAT_BUILTINS = set(
    "exp log sqrt sin cos tan sinh cosh tanh asin acos atan sigmoid floor ceil round pow "
    "builtin_softmax builtin_logsoftmax builtin_binary_crossentropy".split()
)
# builtins of ours that PlaidML 0.7 never had: PlaidMLDevice refuses a program calling one before
# PlaidML sees it (PlaidML aborts on an unknown function, §10.25), docs/semantics.md §10.45
NOT_IN_PLAIDML = frozenset({"round_tf32"})
BIT_OPS = {"bit_not", "bit_and", "bit_or", "bit_xor", "bit_left", "bit_right"}
BOOL_SAFE = set("cmp_eq cmp_ne cond ident as_bool as_int as_uint as_float index shape".split())


def _bool_common(types) -> bool:
    """Whether PlaidML's common type of these is bool: bool is an 8-bit integer there and the left
    operand wins a tie, so ``bool + int8`` is bool (§10.11)."""
    kinds = [t.dtype.numpy for t in types]
    return bool(kinds) and kinds[0].kind == "b" and all(k.kind == "b" or k.itemsize == 1 for k in kinds[1:])


def _bool_difference(call: TCall) -> Difference | None:
    types = [a.type for a in call.args]
    mixed = any(t.dtype.numpy.kind != "b" for t in types)
    if call.fn in BIT_OPS and any(t.dtype.numpy.kind == "b" for t in types):
        return _d("10.28", "a bit operation with a bool operand aborts PlaidML", ABORT)
    if call.fn in ("bit_and", "bit_or", "bit_xor"):
        widths = {8 if isinstance(a, TConst) else a.type.dtype.numpy.itemsize for a in call.args}
        if len(widths) > 1:  # no conversion there: LLVM rejects `and i8 %a, i32 %b`
            return _d(
                "10.34", "`&`, `|`, `^` of different integer widths abort PlaidML (literals: 64-bit)", ABORT
            )
    if call.fn in ("cmp_eq", "cmp_ne") and mixed and _bool_common(types):
        return _d("10.11", "bool is 8 bits wide in PlaidML: `bool == int8` compares in bool", VALUES)
    if call.fn == "cond" and _bool_common(types[1:]) and any(t.dtype.numpy.kind != "b" for t in types[1:]):
        return _d("10.11", "bool is 8 bits wide in PlaidML: `c ? bool : int8` is bool", VALUES, DTYPE)
    if call.fn not in BOOL_SAFE and _bool_common(types):
        return _d("10.28", "an operation on bools (8-bit there) aborts PlaidML (relu: float32)", ABORT, DTYPE)
    return None


def _signed_bits(e: TExpr) -> bool:
    return (
        isinstance(e, TCall)
        and e.fn in BIT_OPS - {"bit_left", "bit_right"}
        and e.type.dtype.numpy.kind == "i"
    )


def _value(values: Mapping | None, e: TExpr) -> np.ndarray | None:
    """The value of an argument where it is known: a constant, or a tensor ``values`` holds."""
    if isinstance(e, TConst) and isinstance(e.value, (int, Fraction)):
        return np.asarray(float(e.value) if isinstance(e.value, Fraction) else e.value)
    if isinstance(e, TRef) and values is not None and e.name in values:
        return np.asarray(values[e.name])
    return None


def _any(v: np.ndarray | None, test) -> bool:
    """``test`` holds somewhere in ``v``; an unknown value may hold anything."""
    return True if v is None else bool(test(v).any())


def _call_differences(call: TCall, values: Mapping | None) -> list[Difference]:
    """The differences one builtin call can show (``values``: every tensor, or None)."""
    found = []
    kinds = [a.type.dtype.numpy.kind for a in call.args]
    dtypes = [a.type.dtype.numpy for a in call.args]
    if call.fn == "prng_value":
        found.append(_d("5.8", "PlaidML 0.7's llvm_cpu device runs another generator", VALUES))
    if call.fn in ("asinh", "acosh", "atanh"):
        found.append(_d("10.29", "asinh, acosh and atanh are not PlaidML builtins (abort)", ABORT))
    if call.fn == "mod":  # plaidml_observed.md: "Modulus only allowed in bind time code"
        found.append(_d("5.2", "PlaidML 0.7 refuses mod of tensors (bind-time code only)", ERROR, ABORT))
    if call.fn == "recip":  # plaidml_observed.md: recip aborts
        found.append(_d("5.2", "recip aborts PlaidML 0.7", ABORT))
    if call.fn in NOT_IN_PLAIDML:
        what = f"{call.fn} is not a PlaidML 0.7 builtin (refused here; PlaidML aborts)"
        found.append(_d("10.45", what, ERROR, ABORT))
    if call.fn in FLOAT_BUILTINS and any(k != "f" for k in kinds):
        found.append(_d("10.12", "a float builtin of an integer tensor aborts PlaidML", ABORT))
    if call.fn in FLOAT_BUILTINS and np.float16 in dtypes:
        found.append(_d("10.42", "a float builtin of a float16 tensor aborts PlaidML", ABORT))
    if call.fn == "relu" and dtypes[0] not in (np.float32, np.float64):
        found.append(_d("10.12", "integer and float16 relu are float32 in PlaidML", DTYPE))
    if (why := _bool_difference(call)) is not None:
        found.append(why)
    if call.fn == "max" and len(set(dtypes)) == 2:
        x, y = dtypes
        if x.itemsize == y.itemsize and x.kind in "iub" and y.kind in "iub":
            found.append(
                _d("10.36", "max(a, b) of equal-width integers (or bool) has b's type in PlaidML", DTYPE)
            )
    if call.fn in ("max", "min") and "f" in kinds:
        if any(_any(_value(values, a), np.isnan) for a in call.args if a.type.dtype.is_float):
            found.append(_d("10.7", "PlaidML's `max`/`min` of a nan depend on the argument order", VALUES))
    if call.fn == "index" and call.args[0].type.shape[call.params[0]] == 1:
        found.append(
            _d(
                "10.33",
                "index(T, axis) along an axis of size 1 aborts PlaidML (or gives garbage)",
                ABORT,
                VALUES,
            )
        )
    if call.fn in ("as_bool", "cond") and kinds[0] != "b":
        if kinds[0] == "f":
            found.append(_d("10.16", "PlaidML truncates a float condition to an integer first", VALUES))
        elif _any(_value(values, call.args[0]), lambda v: (v != 0) & (v % 2 == 0)):
            found.append(
                _d("10.39", "an integer condition is its lowest bit in PlaidML (2 is false)", VALUES)
            )
    if call.fn.startswith("builtin_") and dtypes[0] == np.float16:
        found.append(
            _d("10.31", "`>` aggregation of float16 aborts PlaidML (softmax takes a row max)", ABORT)
        )
    if call.fn == "as_float" and call.params[0] == 16:
        found.append(_d("10.38", "as_float(x, 16) aborts PlaidML", ABORT))
    if call.fn in ("gather", "scatter"):
        idx = call.args[1]
        rows = call.args[0 if call.fn == "gather" else 2].type.shape[0]
        if _any(_value(values, idx), lambda v: (v < 0) | (v >= rows)):
            found.append(
                _d("10.17", "PlaidML reads or writes out of range for gather/scatter indices", VALUES, ABORT)
            )
        if idx.type.dtype.numpy != np.int32:
            found.append(_d("10.17", "PlaidML takes only int32 gather/scatter indices", ERROR))
    if call.fn in ("bit_left", "bit_right"):
        bits = call.type.dtype.bits
        if _any(_value(values, call.args[1]), lambda v: (v < 0) | (v >= bits)):
            found.append(_d("10.19", "a shift by the width or more is undefined in PlaidML (C)", VALUES))
    if call.fn == "div" and call.type.dtype.numpy.kind in "iub":
        x, y = call.args
        if isinstance(x, TRef) and isinstance(y, TRef) and x.name == y.name:
            found.append(_d("10.27", "integer X / X is 1 in PlaidML, also where X is 0", VALUES))
        elif not isinstance(y, TConst) and _any(_value(values, y), lambda v: v == 0):
            found.append(_d("10.26", "integer division by a zero element traps PlaidML (SIGFPE)", ABORT))
    return found


def _literal_differences(call: TCall) -> list[Difference]:
    """§10.13, §10.14 and the `c1 - X + c2` bug: literals as PlaidML reads them."""
    found = []
    double = any(a.type.dtype == DType.FLOAT64 for a in (call, *call.args))
    for a in call.args:
        if not isinstance(a, TConst):
            continue
        v = a.value
        if isinstance(v, Fraction) and double and Fraction(float(np.float32(v))) != v:
            found.append(_d("10.13", "a float literal is a float32 constant in PlaidML", VALUES))
        if isinstance(v, int) and not -(2**31) <= v < 2**31:
            found.append(_d("10.14", "every integer literal is int32 in PlaidML", VALUES, DTYPE))
    if call.fn == "add" and isinstance(call.args[1], TConst):
        lhs = call.args[0]
        if isinstance(lhs, TCall) and lhs.fn == "sub" and isinstance(lhs.args[0], TConst):
            if not isinstance(lhs.args[1], TConst):
                found.append(_d("10", "PlaidML 0.7 bug: `c1 - X + c2` is computed as `c1 + X + c2`", VALUES))
    return found


def elementwise_differences(bound: BoundProgram, values: Mapping | None = None) -> list[Difference]:
    """The differences the elementwise statements of ``bound`` can show (``values``: every tensor;
    None: value-dependent ones count as possible)."""
    found = []
    unsigned_bits = set()  # tensors PlaidML computed with & | ^ ~ on signed ints
    for s in bound.stmts:
        if not isinstance(s, TAssign):  # (contractions: see program_differences)
            continue
        if _signed_bits(s.expr):
            unsigned_bits.add(s.name)
        for call in calls(s.expr):
            for a in call.args:
                if _signed_bits(a) or (isinstance(a, TRef) and a.name in unsigned_bits):
                    found.append(
                        _d(
                            "10.35",
                            "PlaidML reuses a result of & | ^ ~ on signed ints as unsigned",
                            VALUES,
                            ABORT,
                        )
                    )
            found += _call_differences(call, values)
            found += _literal_differences(call)
    return found


def program_differences(bound: BoundProgram, values: Mapping | None = None) -> list[Difference]:
    """The differences a program of elementwise statements and contractions can show."""
    found = elementwise_differences(bound, values) + _prng_state_differences(bound)
    for c in bound.stmts:
        if not isinstance(c, TContraction):
            continue
        found += contraction_differences(c)
        if c.agg in (ast.AggOp.MAX, ast.AggOp.MIN) and any(
            _any(_value(values, TRef(a.tensor, a.type)), np.isnan)
            for a in c.operands
            if a.type.dtype.is_float
        ):
            found.append(_d("10.32", "`>`/`<` aggregations ignore nan in PlaidML", VALUES))
        skip_differs = c.agg in (ast.AggOp.PROD, ast.AggOp.MAX, ast.AggOp.MIN) or c.default is not None
        if skip_differs and _skips(c):
            found.append(
                _d(
                    "10.1",
                    "skipped positions hold the aggregation identity in PlaidML, not 0 or the default",
                    VALUES,
                )
            )
    return found


REFUSALS = {  # the interpreter's run-time refusal (a phrase of its message) -> what PlaidML does
    "more than once": ("10.2", "`=` with two writers for one element: the last write wins in PlaidML"),
    "no index tuple": (
        "10.3",
        "a contraction with no valid tuple aborts PlaidML (or is 'Feasible region empty')",
    ),
    "unbounded": ("10.4", "an unbounded index hangs PlaidML"),
    "only in a constraint": ("10.5", "an index used only in a constraint aborts PlaidML"),
}


def refusal_differences(error: TileError) -> list[Difference]:
    """What PlaidML does on a program the interpreter refuses with ``error`` at run time."""
    return [
        _d(section, what, ABORT, ERROR, HANG, VALUES, DTYPE)
        for phrase, (section, what) in REFUSALS.items()
        if phrase in error.message
    ]


def _prng_state_differences(bound: BoundProgram) -> list[Difference]:
    """A ``prng_step`` whose new state is no output of the program aborts PlaidML 0.7 (seen by the
    peer tests: PlaidML's prng kernel must write its state somewhere)."""
    fns = {s.name: s.expr.fn for s in bound.stmts if isinstance(s, TAssign) and isinstance(s.expr, TCall)}
    if "prng_step" in fns.values() and not any(fns.get(o) == "prng_state" for o in bound.outputs):
        return [_d("5.8", "PlaidML 0.7 aborts on a prng_step whose prng_state is no output", ABORT)]
    return []


def _skips(c: TContraction) -> bool:
    try:
        return not written(c).all()
    except TileError:  # (the interpreter refuses it; not a question for this classification)
        return False


def prng_handles(prog: ast.Program) -> set[str]:
    """The statements that hold a PRNG state (opaque: never compared)."""
    return {
        s.name
        for s in prog.stmts
        if isinstance(s, ast.Assignment) and isinstance(s.expr, ast.Call) and s.expr.fn == "prng_step"
    }


def simple_reduce_differences(prog: ast.Program, bound: BoundProgram) -> list[Difference]:
    """§10.44: PlaidML typed ``simple_reduce`` of small integers and bools its own way."""
    what = "PlaidML types simple_reduce of bools and small integers its own way (an abort where it is used)"
    found = []
    for s in prog.stmts:
        if isinstance(s, ast.Assignment) and isinstance(s.expr, ast.Call) and s.expr.fn == "simple_reduce":
            if bound.types[s.name].dtype.numpy.kind in "biu":
                found.append(_d("10.44", what, DTYPE, ABORT))
    return found


def source_differences(prog: ast.Program) -> list[Difference]:
    """Differences the program's text shows whatever its inputs: §10.20 (an output computed from no
    tensor input aborts PlaidML, which folds ``x * 0`` to a constant first: seen by the conformance
    run, ``O = X * 0`` aborts there, and two such outputs came back holding uninitialised memory)
    and §10.43 (an input that is also a dimension's name)."""
    from tile.size_inputs import size_uses

    sizes = set(size_uses(prog))
    tensors = {i.name for i in prog.inputs if i.name not in sizes}
    found = []
    for s in prog.stmts:
        if isinstance(s, ast.Contraction) or _reads(s.expr, tensors):
            tensors.add(s.name)
    if any(o not in tensors for o in prog.output_names):
        found.append(
            _d(
                "10.20",
                "an output that depends on no tensor input (`x * 0` folded) aborts PlaidML or comes back "
                "unwritten",
                ABORT,
                VALUES,
            )
        )
    dims = {d for i in prog.inputs for d in i.dims or ()}
    if any(i.name in dims for i in prog.inputs):
        found.append(
            _d("10.43", "an input named like a dimension is a duplicate parameter in PlaidML", ERROR)
        )
    return found


def calls_not_in_plaidml(prog: ast.Program) -> list[ast.Call]:
    """The calls of ``prog`` (in statement order) to a builtin PlaidML 0.7 does not have."""
    calls = (e for s in prog.stmts for e in ast.expressions(s) if isinstance(e, ast.Call))
    return [c for c in calls if c.fn in NOT_IN_PLAIDML]


def _reads(e: ast.Expr, tensors: set[str]) -> bool:
    """Whether ``e`` still reads one of ``tensors`` once PlaidML has folded ``x * 0`` to 0."""
    if isinstance(e, ast.Name):
        return e.name in tensors
    if isinstance(e, ast.Binary) and e.op == "*" and any(_zero(x) for x in (e.lhs, e.rhs)):
        return False
    return any(_reads(child, tensors) for child in ast.children(e))


def _zero(e: ast.Expr) -> bool:
    return isinstance(e, ast.IntLit | ast.FloatLit) and e.value == 0
