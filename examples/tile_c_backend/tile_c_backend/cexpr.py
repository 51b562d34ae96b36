"""Scalars in C: the C type of each Tile dtype, literals, conversions and elementwise builtins.

A scalar of dtype ``dt`` is a C value of ``ctype(dt)``; in memory it is ``storage(dt)``. They
differ for two types: ``float16`` is stored as ``_Float16`` but computed as a ``float`` that
always holds a float16 value (every operation rounds its float result with ``tile_h``, which is
what numpy does too), and ``bool`` is an ``uint8_t`` holding 0 or 1.

The rules are docs/semantics.md's (checked against the interpreter, ``ref_interp.elementwise``):
an operation converts its operands to its result type first, except comparisons (which compare
in the promoted type of their operands) and ``cond``'s condition (true where non-zero). Integers
wrap (the library is built with ``-fwrapv``), integer ``x / 0`` and ``x mod 0`` are 0, shift
counts are taken modulo the type's width, float-to-integer conversion truncates and wraps
modulo 2**bits with nan and inf giving 0 (``tile_f2i``), ``max``/``min`` propagate nan and pick
the second of two equal values.
"""

from __future__ import annotations

import math

from tile.dtypes import DType, promote

from tile_c_backend.errors import UnsupportedConstruct

_CTYPES = {
    DType.BOOL: "uint8_t",
    DType.INT8: "int8_t",
    DType.INT16: "int16_t",
    DType.INT32: "int32_t",
    DType.INT64: "int64_t",
    DType.UINT8: "uint8_t",
    DType.UINT16: "uint16_t",
    DType.UINT32: "uint32_t",
    DType.UINT64: "uint64_t",
    DType.FLOAT16: "float",
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
}
# the runtime's per-type helpers (tile_div_i32, tile_max_f64, ...) are named by these suffixes
SUFFIX = {
    DType.BOOL: "u8", DType.INT8: "i8", DType.INT16: "i16", DType.INT32: "i32", DType.INT64: "i64",
    DType.UINT8: "u8", DType.UINT16: "u16", DType.UINT32: "u32", DType.UINT64: "u64",
    DType.FLOAT16: "f32", DType.FLOAT32: "f32", DType.FLOAT64: "f64",
}  # fmt: skip

FLOAT_FNS = frozenset(
    "exp log sqrt sin cos tan sinh cosh tanh asin acos atan asinh acosh atanh floor ceil round".split()
)
COMPARE = {"cmp_eq": "==", "cmp_ne": "!=", "cmp_lt": "<", "cmp_gt": ">", "cmp_le": "<=", "cmp_ge": ">="}
ARITH = {"add": "+", "sub": "-", "mul": "*"}
BITS = {"bit_and": "&", "bit_or": "|", "bit_xor": "^"}
CONVERSIONS = frozenset({"assign", "ident", "as_float", "as_int", "as_uint", "as_bool"})
ARITY = {"cond": 3, "pow": 2, "max": 2, "min": 2, "div": 2, "mod": 2, "bit_left": 2, "bit_right": 2}
ARITY |= {n: 2 for n in (*COMPARE, *ARITH, *BITS)}
SUPPORTED = frozenset(
    {*FLOAT_FNS, *COMPARE, *ARITH, *BITS, *CONVERSIONS, *ARITY}
    | {"neg", "abs", "relu", "bit_not", "recip", "sigmoid", "round_tf32"}
)


def ctype(dt: DType) -> str:
    """The C type a scalar of ``dt`` is computed in."""
    return _CTYPES[dt]


def storage(dt: DType) -> str:
    """The C type an element of ``dt`` is stored as."""
    return "_Float16" if dt is DType.FLOAT16 else _CTYPES[dt]


def unsigned(dt: DType) -> str:
    """The unsigned C type of ``dt``'s width (for wrapping shifts)."""
    return f"uint{max(dt.bits, 8)}_t"


def rounded(expr: str, dt: DType) -> str:
    """``expr``, computed in float for a float16 scalar, rounded to float16 (a no-op otherwise:
    float and double arithmetic already rounds to its own type)."""
    return f"tile_h({expr})" if dt is DType.FLOAT16 else expr


def literal(value: int | float | bool, dt: DType) -> str:
    """``value`` as a C expression of ``ctype(dt)``; floats are written exactly (hex)."""
    if dt.is_float:
        v = float(value)
        if math.isnan(v):
            text = "NAN"
        elif math.isinf(v):
            text = "INFINITY" if v > 0 else "-INFINITY"
        else:
            text = v.hex()
        return f"(({ctype(dt)}){text})"
    if dt is DType.BOOL:
        return "((uint8_t)1)" if value else "((uint8_t)0)"
    v = int(value)
    if v == -(2**63):
        text = "INT64_MIN"
    elif v >= 2**63:
        text = f"UINT64_C({v})"
    else:
        text = f"INT64_C({v})"
    return f"(({ctype(dt)}){text})"


def convert(expr: str, src: DType, dst: DType) -> str:
    """``expr`` (a ``ctype(src)`` value) converted to ``dst`` by Tile's rules (semantics §5.4)."""
    if src is dst:
        return expr
    if dst is DType.BOOL:
        return f"((uint8_t)(({expr}) != 0))"
    if dst is DType.FLOAT16:
        return f"tile_h((double)({expr}))"
    if dst.is_float:
        return f"(({ctype(dst)})({expr}))"
    if src.is_float:  # truncate, then wrap modulo 2**bits; nan and inf give 0
        return f"(({ctype(dst)})tile_f2i((double)({expr})))"
    return f"(({ctype(dst)})({expr}))"  # integers wrap (gcc defines narrowing as modulo)


def identity(op: str, dt: DType) -> str:
    """The identity of aggregation ``op`` in ``dt``, as a C expression (what ``agg_init_<op>``
    fills with): 0, 1, the lowest value (max) or the highest (min)."""
    if op in ("add", "mul"):
        return literal(0 if op == "add" else 1, dt)
    low = op == "max"
    if dt is DType.BOOL:
        return literal(not low, dt)
    if dt.is_float:
        return literal(-math.inf if low else math.inf, dt)
    bits = dt.bits
    if dt.is_signed:
        return literal(-(2 ** (bits - 1)) if low else 2 ** (bits - 1) - 1, dt)
    return literal(0 if low else 2**bits - 1, dt)


def combine(op: str, cur: str, val: str, dt: DType) -> str:
    """The aggregate of ``cur`` and ``val`` (both ``ctype(dt)``) under ``op``, as numpy's
    ``ufunc.at`` forms it in the buffer's type: ``cur`` is the element so far."""
    if op == "add":
        if dt is DType.BOOL:
            return f"((uint8_t)({cur} | {val}))"
        return rounded(f"({ctype(dt)})({cur} + {val})", dt)
    if op == "mul":
        if dt is DType.BOOL:
            return f"((uint8_t)({cur} & {val}))"
        return rounded(f"({ctype(dt)})({cur} * {val})", dt)
    if op in ("max", "min"):
        return _maxmin(op, cur, val, dt)
    raise AssertionError(op)


def _maxmin(op: str, a: str, b: str, dt: DType) -> str:
    if dt.is_float:  # nan propagates (the first's when both are); of equal values the second
        return f"tile_{op}_{SUFFIX[dt]}({a}, {b})"
    return f"({a} {'>' if op == 'max' else '<'} {b} ? {a} : {b})"


def intrinsic(
    name: str, args: list[tuple[str, DType]], dt: DType, params: tuple[int, ...], where: str
) -> str:
    """The C expression of Stripe intrinsic ``name`` (a ``tile.builtins`` elementwise builtin, or
    ``assign``) on ``args`` (C expression, dtype), computing a ``ctype(dt)``."""
    want = ARITY.get(name, 1)
    if name not in SUPPORTED:
        raise UnsupportedConstruct(f"the intrinsic '{name}'", where)
    if len(args) != want:
        raise UnsupportedConstruct(f"the intrinsic '{name}' with {len(args)} inputs (it takes {want})", where)
    if name in COMPARE:
        common = promote(args[0][1], args[1][1])
        a, b = (convert(e, t, common) for e, t in args)
        return f"((uint8_t)({a} {COMPARE[name]} {b}))"
    if name == "cond":
        (c, ct), rest = args[0], args[1:]
        a, b = (convert(e, t, dt) for e, t in rest)
        return f"(({c}) != 0 ? {a} : {b})"
    if name in CONVERSIONS:
        return convert(*args[0], dt)
    if name == "round_tf32":  # of its input converted to float32, whatever dt is
        return convert(f"tile_round_tf32({convert(*args[0], DType.FLOAT32)})", DType.FLOAT32, dt)
    if name in ("bit_left", "bit_right"):
        return _shift(name, args, dt)
    x = [convert(e, t, dt) for e, t in args]  # everything else computes in the result type
    ct = ctype(dt)
    if name in ARITH:
        if dt is DType.BOOL:
            raise UnsupportedConstruct(f"the intrinsic '{name}' on bool (Tile computes it in int32)", where)
        return rounded(f"({ct})({x[0]} {ARITH[name]} {x[1]})", dt)
    if name in BITS:
        if dt.is_float:
            raise UnsupportedConstruct(f"the intrinsic '{name}' on {dt}", where)
        return f"(({ct})({x[0]} {BITS[name]} {x[1]}))"
    if name in ("max", "min"):
        return _maxmin(name, x[0], x[1], dt)
    if name == "div":
        if dt.is_float:
            return rounded(f"({x[0]} / {x[1]})", dt)
        return f"tile_div_{SUFFIX[dt]}({x[0]}, {x[1]})"
    if name == "mod":
        if dt.is_float:
            return rounded(f"{_fn('fmod', dt)}({x[0]}, {x[1]})", dt)
        return f"tile_mod_{SUFFIX[dt]}({x[0]}, {x[1]})"
    if name == "neg":
        if dt.is_float:
            return f"(-{x[0]})"
        return f"(({ct})(0 - ({unsigned(dt)}){x[0]}))"
    if name == "abs":
        if dt.is_float:
            return f"{_fn('fabs', dt)}({x[0]})"
        if dt is DType.BOOL or not dt.is_signed:
            return x[0]
        return f"({x[0]} < 0 ? ({ct})(0 - ({unsigned(dt)}){x[0]}) : {x[0]})"
    if name == "relu":
        return f"({x[0]} < 0 ? ({ct})0 : {x[0]})"
    if name == "bit_not":
        if dt is DType.BOOL:
            return f"((uint8_t)!{x[0]})"
        if dt.is_float:
            raise UnsupportedConstruct(f"the intrinsic 'bit_not' on {dt}", where)
        return f"(({ct})~{x[0]})"
    if not dt.is_float:
        raise UnsupportedConstruct(f"the float intrinsic '{name}' with the result type {dt}", where)
    one = literal(1, dt)
    if name == "recip":
        return rounded(f"({one} / {x[0]})", dt)
    if name == "sigmoid":  # 1 / (1 + exp(-x)), each step rounded in the type, as numpy does
        e = rounded(f"{_fn('exp', dt)}(-{x[0]})", dt)
        return rounded(f"({one} / {rounded(f'({one} + {e})', dt)})", dt)
    if name == "pow":
        return rounded(f"{_fn('pow', dt)}({x[0]}, {x[1]})", dt)
    assert name in FLOAT_FNS, name
    return rounded(f"{_fn(name, dt)}({x[0]})", dt)


def _fn(name: str, dt: DType) -> str:
    """The C library function ``name`` for ``dt``: ``expf`` for float32 (and float16, computed in
    float and rounded), ``exp`` for float64."""
    return name if dt is DType.FLOAT64 else f"{name}f"


def _shift(name: str, args: list[tuple[str, DType]], dt: DType) -> str:
    """``<<`` / ``>>`` in ``dt`` (bool shifts in int32), the count modulo the width; ``>>`` is
    arithmetic for signed types. A left shift goes through the unsigned type: no overflow."""
    work = DType.INT32 if dt is DType.BOOL else dt
    a, count = (convert(e, t, work) for e, t in args)
    count = f"(({count}) & {work.bits - 1})"
    if name == "bit_left":
        wide = "uint64_t" if work.bits == 64 else "uint32_t"
        out = f"(({ctype(work)})(({wide}){a} << {count}))"
    else:
        out = f"(({ctype(work)})({a} >> {count}))"
    return convert(out, work, dt)
