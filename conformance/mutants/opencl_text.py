"""Defects in the OpenCL C source of ``backends.opencl`` (before the driver compiles it): the
work-item edge, loop bounds, identities of max and min, NaN handling, accumulator precision,
comparisons, integer wrap-around, division and remainder rounding, casts, float16/bfloat16
rounding, constants."""

from __future__ import annotations

from conformance.mutants.base import Mutant, Witness, arrays
from conformance.mutants.text import minus_one, sub

F32, F64, I32, U8, F16 = "float32", "float64", "int32", "uint8", "float16"
NAME = r"[A-Za-z_]\w*"
NAN, INF = float("nan"), float("inf")


def _ew(expr: str, dtype, **values) -> Witness:
    return Witness(f"function ({', '.join(values)}) -> (O) {{ O = {expr}; }}", arrays(dtype, **values))


def _red(agg: str, dtype, rows) -> Witness:
    return Witness(f"function (X[N, M]) -> (O) {{ O[i: N] = {agg}(X[i, j]); }}", arrays(dtype, X=rows))


def _floor_div(m) -> str:
    """``((T)(a / b))`` rounded toward -inf: one less where the quotient is negative and inexact."""
    t, a, b = m.groups()
    return f"(({t})(({a} / {b}) - (({a} % {b} != 0) && (({a} < 0) != ({b} < 0)))))"


MUTANTS = [
    Mutant("opencl_workitem_edge", "opencl", "work-group edge", "the last work-item returns early",
           minus_one(r"if \(gid >= (?P<n>\d+)\) return;"),
           _ew("X + 1", I32, X=[[1, 6, 2], [3, 4, 5]])),
    Mutant("opencl_loop_bound_short", "opencl", "loop edge", "constant loop bounds one short",
           minus_one(rf"for \(long ({NAME}) = 0; \1 < (?P<n>\d+);"),
           _red("+", I32, [[1, 5, 3], [-2, -7, -1]])),
    Mutant("opencl_loop_start_one", "opencl", "loop edge", "loops start at 1",
           sub(rf"for \(long ({NAME}) = 0; ", r"for (long \1 = 1; "),
           _red("+", F32, [[1, 5, 3], [-2, -7, -1]])),
    Mutant("opencl_max_identity_zero", "opencl", "identity", "max starts at 0, not -inf",
           sub(r"\(-INFINITY\)", "0.0f"), _red(">", F32, [[-1, -5, -3], [-2, -7, -1]])),
    Mutant("opencl_min_identity_zero", "opencl", "identity", "min starts at 0, not +inf",
           sub(r"(?<![-\w])INFINITY", "0.0f"), _red("<", F32, [[1, 5, 3], [2, 7, 1]])),
    Mutant("opencl_isnan_dropped", "opencl", "nan", "max and min ignore a nan first operand",
           sub(r"\|\| isnan\(", "|| 0 && isnan("), _ew("min(X, Y)", F32, X=[1, NAN], Y=[2, 3])),
    Mutant("opencl_double_accumulator_float", "opencl", "precision", "double accumulators held in float",
           sub(r"\bdouble (acc_\w+)", r"float \1"), _red("+", F64, [[16777216, 1, 1], [1e-9, 1, -1]])),
    Mutant("opencl_lt_as_le", "opencl", "comparison", "a < b as a <= b in comparisons of data",
           sub(rf"= \(({NAME}) < ({NAME})\);", r"= (\1 <= \2);"), _ew("X < Y", F32, X=[1, 3], Y=[2, 3])),
    Mutant("opencl_ge_as_gt", "opencl", "comparison", "a >= b as a > b in comparisons of data",
           sub(rf"= \(({NAME}) >= ({NAME})\);", r"= (\1 > \2);"), _ew("X >= Y", I32, X=[1, 3], Y=[2, 3])),
    Mutant("opencl_eq_as_ne", "opencl", "comparison", "a == b as a != b in comparisons of data",
           sub(rf"= \(({NAME}) == ({NAME})\);", r"= (\1 != \2);"), _ew("X == Y", I32, X=[1, 3], Y=[2, 3])),
    Mutant("opencl_wrap_as_saturate", "opencl", "overflow", "int + saturates instead of wrapping",
           sub(rf"\(\(int\)\(\(uint\)({NAME}) \+ \(uint\)({NAME})\)\)", r"add_sat(\1, \2)"),
           _ew("X + Y", I32, X=[2147483647, 3], Y=[1, 3])),
    Mutant("opencl_int_sub_operands", "opencl", "operand order", "int a - b as b - a",
           sub(rf"\(uint\)({NAME}) - \(uint\)({NAME})", r"(uint)\2 - (uint)\1"),
           _ew("X - Y", I32, X=[1, 5], Y=[2, 3])),
    Mutant("opencl_float_sub_operands", "opencl", "operand order", "float a - b as b - a",
           sub(rf"= \(({NAME}) - ({NAME})\);", r"= (\2 - \1);"), _ew("X - Y", F32, X=[1, 5], Y=[2, 3])),
    Mutant("opencl_div_floors", "opencl", "division", "integer division floors instead of truncating",
           sub(rf"\(\((int|long|short|char)\)\(({NAME}) / ({NAME})\)\)",
               _floor_div),
           _ew("X / Y", I32, X=[-7, 7], Y=[2, 2])),
    Mutant("opencl_mod_python_sign", "opencl", "division", "integer mod takes the divisor's sign",
           sub(rf"\(\((int|long)\)\(({NAME}) % ({NAME})\)\)", r"((\1)(((\2 % \3) + \3) % \3))"),
           _ew("mod(X, Y)", I32, X=[-7, 7], Y=[3, 3])),
    Mutant("opencl_fmod_as_remainder", "opencl", "division", "float mod rounds the quotient to nearest",
           sub(r"\bfmod\(", "remainder("), _ew("mod(X, Y)", F32, X=[5, 7], Y=[3, 4])),
    Mutant("opencl_char_cast_saturates", "opencl", "cast", "casts to 8 bits saturate",
           sub(rf"\(\((u?char)\)({NAME})\)", r"convert_\1_sat(\2)"), _ew("as_int(X, 8)", I32, X=[200, 6])),
    Mutant("opencl_half_rounding_dropped", "opencl", "precision", "no rounding to float16",
           sub(r"\btile_rh\(", "("), _ew("as_float(as_float(X, 16), 32)", F32, X=[1.0001, 70000])),
    Mutant("opencl_bfloat_rounding_dropped", "opencl", "precision", "no rounding to bfloat16",
           sub(r"\btile_rbf\(", "("), _ew("as_float(as_bfloat(X, 16), 32)", F32, X=[1.0001, 257])),
    Mutant("opencl_fabs_dropped", "opencl", "operator", "fabs as the identity",
           sub(r"\bfabs\(", "("), _ew("abs(X)", F32, X=[1.5, -2.5])),
    Mutant("opencl_round_floor", "opencl", "rounding", "round built on floor instead of trunc",
           sub(r"= trunc\(", "= floor("), _ew("round(X)", F32, X=[1.5, -2.5])),
    Mutant("opencl_float_literal_exponent", "opencl", "constant", "float literals twice too large",
           sub(r"\b0x1\.(\w+)p([+-]\d+)", lambda m: f"0x1.{m.group(1)}p{int(m.group(2)) + 1:+d}"),
           _ew("X * 0.5", F32, X=[1, 6])),
    Mutant("opencl_uint8_as_int8", "opencl", "signedness", "uchar values read as char",
           sub(r"\buchar s_", "char s_"), _ew("X + 1", U8, X=[200, 6])),
    Mutant("opencl_half_inf_clamped", "opencl", "inf", "infinities become the largest finite value",
           sub(r"(?<![-\w])INFINITY", "FLT_MAX"), _red("<", F32, [[INF, INF, INF], [2, 7, 1]])),
    # written after the sweeps were broadened, and checked without changing them (held-out style)
    Mutant("opencl_long_loop_short", "opencl", "loop edge", "constant loop bounds above 32 one short",
           minus_one(rf"for \(long ({NAME}) = 0; \1 < (?P<n>\d+);", above=32),
           _red("+", I32, [list(range(-20, 20)), list(range(40))])),
    # written after the sweeps covered every integer type and chained float operations in every
    # float type, and checked without changing the generators (held-out style, 2026-12-07)
    Mutant("opencl_gid_plus_one", "opencl", "work-group edge", "work-items read their id one too large",
           sub(r"get_global_id\(0\)", "(get_global_id(0) + 1)"), _ew("X + 1", I32, X=[[1, 6, 2], [3, 4, 5]])),
    Mutant("opencl_fdiv_operands", "opencl", "operand order", "float a / b as b / a",
           sub(rf"= \(({NAME}) / ({NAME})\);", r"= (\2 / \1);"), _ew("X / Y", F32, X=[1, 6], Y=[2, 3])),
    Mutant("opencl_isnan_as_isinf", "opencl", "nan", "max and min test their first operand for inf, not nan",
           sub(r"\bisnan\(", "isinf("), _ew("max(X, Y)", F32, X=[1, NAN], Y=[2, 3])),
    Mutant("opencl_init_store_dropped", "opencl", "store", "the stores that initialize outputs dropped",
           sub(r"\n\s*b\d+_\w+\[gid\] = [^;]*;", ""), _red(">", F32, [[-1, -5, -3], [-2, -7, -1]])),
]
