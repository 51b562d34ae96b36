"""Defects in the optimized Stripe kernels, applied where the device's compiler receives them:
the aggregation ops and their identities, elementwise operators and their operand order,
constants, constraints and index ranges, casts and the precision of temporaries and accumulators,
stores. Each rewrite is systematic (every match in every kernel) and returns the block it was
given where nothing matches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import ml_dtypes
import numpy as np

from conformance.mutants.base import Mutant, Witness, arrays
from stripe.ir import Block, Constant, Index, Intrinsic, LoadIndex, RefDir, Refinement, Special, Store
from tile.dtypes import DType


def rewrite(
    block: Block,
    stmt: Callable | None = None,
    ref: Callable | None = None,
    node: Callable | None = None,
) -> Block:
    """``block`` with ``stmt`` applied to every non-block statement (it returns a statement, or
    None to drop it), ``ref`` to every refinement and ``node`` to every block (after its
    children), at every depth."""
    stmts = []
    for s in block.stmts:
        if isinstance(s, Block):
            stmts.append(rewrite(s, stmt, ref, node))
        elif stmt is None:
            stmts.append(s)
        else:
            new = stmt(s)
            if new is not None:
                stmts.append(new)
    refs = tuple(ref(r) for r in block.refs) if ref else block.refs
    same = stmts == list(block.stmts) and refs == block.refs
    out = block if same else replace(block, stmts=tuple(stmts), refs=refs)
    return node(out) if node else out


def agg_swap(old: str, new: str) -> Callable[[Block], Block]:
    return lambda b: rewrite(b, ref=lambda r: replace(r, agg_op=new) if r.agg_op == old else r)


def intrinsic_swap(old: str, new: str) -> Callable[[Block], Block]:
    def stmt(s):
        return replace(s, name=new) if isinstance(s, Intrinsic) and s.name == old else s

    return lambda b: rewrite(b, stmt)


def operands_swapped(name: str, first: int = 0) -> Callable[[Block], Block]:
    """The operands ``first`` and ``first + 1`` of every ``name`` exchanged."""

    def stmt(s):
        if isinstance(s, Intrinsic) and s.name == name and len(s.inputs) > first + 1:
            ins = list(s.inputs)
            ins[first], ins[first + 1] = ins[first + 1], ins[first]
            return replace(s, inputs=tuple(ins))
        return s

    return lambda b: rewrite(b, stmt)


def special_swap(old: str, new: str) -> Callable[[Block], Block]:
    def stmt(s):
        return replace(s, name=new) if isinstance(s, Special) and s.name == old else s

    return lambda b: rewrite(b, stmt)


def constants_offset(is_float: bool, delta) -> Callable[[Block], Block]:
    def stmt(s):
        if isinstance(s, Constant) and s.dtype.is_float == is_float and s.dtype != DType.BOOL:
            return replace(s, value=s.value + delta)
        return s

    return lambda b: rewrite(b, stmt)


def constraints_tightened(b: Block) -> Block:
    """Every constraint ``c >= 0`` as ``c - 1 >= 0``: each bound drops its edge point."""
    return rewrite(b, node=lambda x: replace(x, constraints=tuple(c - 1 for c in x.constraints)))


def constraints_loosened(b: Block) -> Block:
    """Every constraint ``c >= 0`` as ``c + 1 >= 0``: each bound admits one point past its edge."""
    return rewrite(b, node=lambda x: replace(x, constraints=tuple(c + 1 for c in x.constraints)))


def load_index_offset(b: Block) -> Block:
    return rewrite(b, lambda s: replace(s, affine=s.affine + 1) if isinstance(s, LoadIndex) else s)


def last_range_short(nested: bool) -> Callable[[Block], Block]:
    """The last index of each kernel (``nested``: of each block inside a kernel) one short:
    the remainder of a loop or the edge of a tile is never run."""

    def shorten(x: Block) -> Block:
        if not x.idxs or x.idxs[-1].range < 2:
            return x
        last = x.idxs[-1]
        return replace(x, idxs=(*x.idxs[:-1], Index(last.name, last.range - 1, last.affine)))

    def apply(b: Block) -> Block:
        if not nested:
            return shorten(b)
        inner = (rewrite(s, node=shorten) if isinstance(s, Block) else s for s in b.stmts)
        return replace(b, stmts=tuple(inner))

    return apply


def last_store_dropped(b: Block) -> Block:
    """The last store of every block that stores (a dead-store elimination that was wrong)."""

    def node(x: Block) -> Block:
        at = [i for i, s in enumerate(x.stmts) if isinstance(s, Store)]
        return replace(x, stmts=x.stmts[: at[-1]] + x.stmts[at[-1] + 1 :]) if at else x

    return rewrite(b, node=node)


def cast_width(name: str, old: int, new: int) -> Callable[[Block], Block]:
    def stmt(s):
        if isinstance(s, Intrinsic) and s.name == name and s.params[:1] == (old,):
            return replace(s, params=(new, *s.params[1:]), dtype=_WIDTHS[(name, new)])
        return s

    return lambda b: rewrite(b, stmt)


_WIDTHS = {("as_int", 16): DType.INT16, ("as_int", 32): DType.INT32, ("as_uint", 16): DType.UINT16,
           ("as_float", 32): DType.FLOAT32, ("as_uint", 32): DType.UINT32, ("as_float", 64): DType.FLOAT64}


def intrinsic_dtype(old: DType, new: DType) -> Callable[[Block], Block]:
    """Arithmetic computed in ``new`` where the program says ``old`` (casts keep their type)."""

    def stmt(s):
        if isinstance(s, Intrinsic) and s.dtype == old and not s.name.startswith("as_"):
            return replace(s, dtype=new)
        return s

    return lambda b: rewrite(b, stmt)


def accumulator_dtype(old: DType, new: DType) -> Callable[[Block], Block]:
    """Local accumulators (and the refinements that aggregate into them) held in ``new``."""

    def ref(r: Refinement) -> Refinement:
        local = r.dir == RefDir.NONE and r.from_ is None
        if r.shape.dtype == old and (local or r.agg_op in ("add", "mul", "max", "min")):
            return replace(r, shape=replace(r.shape, dtype=new))
        return r

    return lambda b: rewrite(b, ref=ref)


F32, F64, I32 = np.float32, np.float64, np.int32
ROWMAX = "function (X[N, M]) -> (O) { O[i: N] = >(X[i, j]); }"
ROWMIN = "function (X[N, M]) -> (O) { O[i: N] = <(X[i, j]); }"
ROWSUM = "function (X[N, M]) -> (O) { O[i: N] = +(X[i, j]); }"
ROWPROD = "function (X[N, M]) -> (O) { O[i: N] = *(X[i, j]); }"


def _ew(expr: str, dtype, **values) -> Witness:
    names = ", ".join(values)
    return Witness(f"function ({names}) -> (O) {{ O = {expr}; }}", arrays(dtype, **values))


MUTANTS = [
    Mutant("stripe_agg_max_as_min", "stripe", "aggregation", "max aggregation computed as min",
           agg_swap("max", "min"), Witness(ROWMAX, arrays(F32, X=[[1, 5, 3], [-2, -7, -1]]))),
    Mutant("stripe_agg_min_as_max", "stripe", "aggregation", "min aggregation computed as max",
           agg_swap("min", "max"), Witness(ROWMIN, arrays(F32, X=[[1, 5, 3], [-2, -7, -1]])), "opencl_cpu.0"),
    Mutant("stripe_agg_add_as_mul", "stripe", "aggregation", "sums computed as products",
           agg_swap("add", "mul"), Witness(ROWSUM, arrays(I32, X=[[1, 5, 3], [-2, -7, -1]]))),
    Mutant("stripe_agg_mul_as_add", "stripe", "aggregation", "products computed as sums",
           agg_swap("mul", "add"), Witness(ROWPROD, arrays(I32, X=[[1, 5, 3], [-2, -7, -1]]))),
    Mutant("stripe_init_max_as_zero", "stripe", "identity", "a max output starts at 0, not -inf",
           special_swap("agg_init_max", "zero"),
           Witness("function (X[N, M]) -> (O) { O[i: N] = >(X[i, j]), j < 2; }",
                   arrays(F32, X=[[-1, -5, -3], [-2, -7, -1]]))),
    Mutant("stripe_init_min_as_zero", "stripe", "identity", "a min output starts at 0, not +inf",
           special_swap("agg_init_min", "zero"),
           Witness("function (X[N, M]) -> (O) { O[i: N] = <(X[i, j]), j < 2; }",
                   arrays(I32, X=[[1, 5, 3], [2, 7, 1]]))),
    Mutant("stripe_max_as_min", "stripe", "operator", "elementwise max computed as min",
           intrinsic_swap("max", "min"), _ew("max(X, Y)", F32, X=[1, 5], Y=[2, 3])),
    Mutant("stripe_min_as_max", "stripe", "operator", "elementwise min computed as max",
           intrinsic_swap("min", "max"), _ew("min(X, Y)", I32, X=[1, 5], Y=[2, 3]), "opencl_cpu.0"),
    Mutant("stripe_sub_as_add", "stripe", "operator", "subtraction computed as addition",
           intrinsic_swap("sub", "add"), _ew("X - Y", I32, X=[1, 5], Y=[2, 3])),
    Mutant("stripe_mul_as_add", "stripe", "operator", "multiplication computed as addition",
           intrinsic_swap("mul", "add"), _ew("X * Y", F32, X=[1, 5], Y=[2, 3])),
    Mutant("stripe_div_as_mul", "stripe", "operator", "division computed as multiplication",
           intrinsic_swap("div", "mul"), _ew("X / Y", F32, X=[1, 6], Y=[2, 3])),
    Mutant("stripe_lt_as_le", "stripe", "comparison", "< computed as <= (ties)",
           intrinsic_swap("cmp_lt", "cmp_le"), _ew("X < Y", I32, X=[1, 3], Y=[2, 3])),
    Mutant("stripe_gt_as_ge", "stripe", "comparison", "> computed as >= (ties)",
           intrinsic_swap("cmp_gt", "cmp_ge"), _ew("X > Y", F32, X=[1, 3], Y=[2, 3]), "opencl_cpu.0"),
    Mutant("stripe_ge_as_gt", "stripe", "comparison", ">= computed as > (ties)",
           intrinsic_swap("cmp_ge", "cmp_gt"), _ew("X >= Y", F32, X=[1, 3], Y=[2, 3])),
    Mutant("stripe_le_as_lt", "stripe", "comparison", "<= computed as < (ties)",
           intrinsic_swap("cmp_le", "cmp_lt"), _ew("X <= Y", I32, X=[1, 3], Y=[2, 3])),
    Mutant("stripe_eq_as_ne", "stripe", "comparison", "== computed as !=",
           intrinsic_swap("cmp_eq", "cmp_ne"), _ew("X == Y", I32, X=[1, 3], Y=[2, 3])),
    Mutant("stripe_and_as_or", "stripe", "operator", "bitwise and computed as or",
           intrinsic_swap("bit_and", "bit_or"), _ew("X & Y", I32, X=[1, 6], Y=[2, 3])),
    Mutant("stripe_xor_as_or", "stripe", "operator", "bitwise xor computed as or",
           intrinsic_swap("bit_xor", "bit_or"), _ew("X ^ Y", I32, X=[1, 6], Y=[2, 3]), "opencl_cpu.0"),
    Mutant("stripe_floor_as_ceil", "stripe", "rounding", "floor computed as ceil",
           intrinsic_swap("floor", "ceil"), _ew("floor(X)", F32, X=[1.5, -2.5])),
    Mutant("stripe_round_as_floor", "stripe", "rounding", "round computed as floor",
           intrinsic_swap("round", "floor"), _ew("round(X)", F32, X=[1.5, -2.5])),
    Mutant("stripe_relu_as_ident", "stripe", "operator", "relu computed as the identity",
           intrinsic_swap("relu", "ident"), _ew("relu(X)", F32, X=[1.5, -2.5])),
    Mutant("stripe_sub_operands", "stripe", "operand order", "a - b computed as b - a",
           operands_swapped("sub"), _ew("X - Y", F32, X=[1, 5], Y=[2, 3]), "opencl_cpu.0"),
    Mutant("stripe_div_operands", "stripe", "operand order", "a / b computed as b / a",
           operands_swapped("div"), _ew("X / Y", I32, X=[1, 6], Y=[2, 3])),
    Mutant("stripe_mod_operands", "stripe", "operand order", "mod(a, b) computed as mod(b, a)",
           operands_swapped("mod"), _ew("mod(X, Y)", I32, X=[7, 6], Y=[2, 4])),
    Mutant("stripe_lt_operands", "stripe", "operand order", "a < b computed as b < a",
           operands_swapped("cmp_lt"), _ew("X < Y", F32, X=[1, 6], Y=[2, 3])),
    Mutant("stripe_cond_branches", "stripe", "operand order", "c ? a : b computed as c ? b : a",
           operands_swapped("cond", 1), _ew("X < Y ? X : Y", F32, X=[1, 6], Y=[2, 3])),
    Mutant("stripe_int_constant_plus_one", "stripe", "constant", "integer constants one too large",
           constants_offset(False, 1), _ew("X * 3", I32, X=[1, 6])),
    Mutant("stripe_float_constant_offset", "stripe", "constant", "float constants 2^-10 too large",
           constants_offset(True, 2.0**-10), _ew("X * 0.5", F64, X=[1, 6])),
    Mutant("stripe_constraint_edge", "stripe", "constraint", "every constraint loses its edge point",
           constraints_tightened,
           Witness("function (X[N]) -> (O) { O[i: 4] = +(X[i + k - 1]), k < 3; }",
                   arrays(I32, X=[1, 2, 3, 4]))),
    Mutant("stripe_index_plus_one", "stripe", "constant", "index() one too large",
           load_index_offset, _ew("index(X, 0)", I32, X=[1, 6])),
    Mutant("stripe_kernel_remainder", "stripe", "loop edge", "each kernel's last index one short",
           last_range_short(False), _ew("X + 1", I32, X=[[1, 6, 2], [3, 4, 5]])),
    Mutant("stripe_tile_edge", "stripe", "loop edge", "the last index of nested (tile) blocks one short",
           last_range_short(True), Witness(ROWSUM, arrays(I32, X=[[1, 5, 3], [-2, -7, -1]]))),
    Mutant("stripe_store_dropped", "stripe", "store", "the last store of each block dropped",
           last_store_dropped, _ew("X + 1", F32, X=[1, 6])),
    Mutant("stripe_as_int8_as_16", "stripe", "cast", "as_int(x, 8) keeps 16 bits",
           cast_width("as_int", 8, 16), _ew("as_float(as_int(X, 8), 32)", I32, X=[200, 6])),
    Mutant("stripe_as_uint16_as_32", "stripe", "cast", "as_uint(x, 16) keeps 32 bits",
           cast_width("as_uint", 16, 32), _ew("as_float(as_uint(X, 16), 64)", I32, X=[-1, 70000])),
    Mutant("stripe_as_float16_as_32", "stripe", "cast", "as_float(x, 16) does not round to float16",
           cast_width("as_float", 16, 32), _ew("as_float(as_float(X, 16), 32)", F32, X=[1.0001, 70000])),
    Mutant("stripe_fp64_temporaries_fp32", "stripe", "precision", "float64 arithmetic done in float32",
           intrinsic_dtype(DType.FLOAT64, DType.FLOAT32), _ew("X + Y", F64, X=[1, 16777216], Y=[1e-9, 1])),
    Mutant("stripe_fp32_temporaries_fp16", "stripe", "precision", "float32 arithmetic done in float16",
           intrinsic_dtype(DType.FLOAT32, DType.FLOAT16), _ew("X * Y", F32, X=[1, 300], Y=[3, 301])),
    Mutant("stripe_int32_temporaries_int16", "stripe", "integer width", "int32 arithmetic done in int16",
           intrinsic_dtype(DType.INT32, DType.INT16), _ew("X * Y", I32, X=[1, 300], Y=[3, 301])),
    Mutant("stripe_fp64_accumulator_fp32", "stripe", "precision", "float64 accumulators held in float32",
           accumulator_dtype(DType.FLOAT64, DType.FLOAT32),
           Witness(ROWSUM, arrays(F64, X=[[16777216, 1, 1], [1e-9, 1, -1]]))),
    Mutant("stripe_int32_accumulator_int16", "stripe", "integer width", "int32 accumulators held in int16",
           accumulator_dtype(DType.INT32, DType.INT16),
           Witness(ROWSUM, arrays(I32, X=[[30000, 30000, 1], [1, 1, -1]]))),
    # written after the sweeps were broadened, and checked without changing them (held-out style)
    Mutant("stripe_fp16_temporaries_fp32", "stripe", "precision", "float16 arithmetic done in float32",
           intrinsic_dtype(DType.FLOAT16, DType.FLOAT32),
           _ew("X * Y + Z", np.float16, X=[1 + 2**-10, 1], Y=[1 + 2**-10, 1], Z=[-(1 + 2**-9), 1])),
    Mutant("stripe_uint8_temporaries_int8", "stripe", "signedness", "uint8 arithmetic done in int8",
           intrinsic_dtype(DType.UINT8, DType.INT8), _ew("X / Y", np.uint8, X=[200, 6], Y=[3, 7])),
    Mutant("stripe_constraint_loosened", "stripe", "constraint", "every constraint admits one more point",
           constraints_loosened,
           Witness("function (X[N, M]) -> (O) { O[i: N] = +(X[i, j]), i - j < 3; }",
                   arrays(I32, X=[[1, 2, 3], [4, 5, 6]]))),
    # written after the sweeps covered every integer type and chained float operations in every
    # float type, and checked without changing the generators (held-out style, 2026-12-07)
    Mutant("stripe_int64_temporaries_int32", "stripe", "integer width", "int64 arithmetic done in int32",
           intrinsic_dtype(DType.INT64, DType.INT32), _ew("X * Y", np.int64, X=[2**31, 3], Y=[3, 5])),
    Mutant("stripe_uint16_temporaries_int16", "stripe", "signedness", "uint16 arithmetic done in int16",
           intrinsic_dtype(DType.UINT16, DType.INT16), _ew("X / Y", np.uint16, X=[60000, 6], Y=[3, 7])),
    Mutant("stripe_bf16_temporaries_fp32", "stripe", "precision", "bfloat16 arithmetic done in float32",
           intrinsic_dtype(DType.BFLOAT16, DType.FLOAT32),
           _ew("X * X + Y", ml_dtypes.bfloat16, X=[1 + 2**-7, 1], Y=[-(1 + 2**-6), 1])),
    Mutant("stripe_fp32_temporaries_fp64", "stripe", "precision", "float32 arithmetic done in float64",
           intrinsic_dtype(DType.FLOAT32, DType.FLOAT64),
           _ew("X * X + Y", F32, X=[1 + 2**-23, 1], Y=[-(1 + 2**-22), 1])),
    Mutant("stripe_as_uint8_as_16", "stripe", "cast", "as_uint(x, 8) keeps 16 bits",
           cast_width("as_uint", 8, 16), _ew("as_float(as_uint(X, 8), 32)", I32, X=[300, 6])),
    Mutant("stripe_as_float32_as_64", "stripe", "cast", "as_float(x, 32) does not round to float32",
           cast_width("as_float", 32, 64), _ew("as_float(as_float(X, 32), 64)", F64, X=[1 + 2**-40, 3])),
    Mutant("stripe_ge_operands", "stripe", "operand order", "a >= b computed as b >= a",
           operands_swapped("cmp_ge"), _ew("X >= Y", I32, X=[1, 6], Y=[2, 3])),
    Mutant("stripe_ceil_as_round", "stripe", "rounding", "ceil computed as round",
           intrinsic_swap("ceil", "round"), _ew("ceil(X)", F32, X=[1.25, -2.5])),
]
