"""Drawn elementwise programs (the ``elementwise`` family): the builtin templates, chains over
them, chains through the structural builtins and casts, and the sweeps of every exact builtin
(``conformance.sweeps``)."""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from conformance import sweeps
from conformance.case import FLOAT_DTYPES, INT_DTYPES, Case, small_ints

# ---------------------------------------------------------------------------- elementwise
# exact: the same bits on every target (float32, then TF32; 1 + 2^-11 and its multiples are ties),
# but not integer-valued, so a later sum of its values may round
ROUND_TF32 = "round_tf32({0} * 1.00048828125)"
UNARY_EXACT = [
    "-{0}",
    "abs({0})",
    "relu({0})",
    "{0} * {0}",
    "floor({0} / 2)",
    "ceil({0} / 2)",
    "round({0} / 2)",
    "as_int({0}, 8)",
    "as_float({0}, 64)",
    "{0} > 0",
    "~({0} > 1)",
    "reverse_grad({0}, 2)",
    ROUND_TF32,
    "index({0}, 0)",  # (last: the mixed family leaves it out)
]
BINARY_EXACT = [
    "{0} + {1}",
    "{0} - {1}",
    "{0} * {1}",
    "{0} / {1}",
    "max({0}, {1})",
    "min({0}, {1})",
    "{0} == {1}",
    "{0} != {1}",
    "{0} < {1} ? {0} : {1}",
    "{0} <= {1}",
    "{0} >= {1}",
    "mod({0}, {1} == 0 ? 2 : {1})",  # x mod 0 (0, or nan) is in the builtin tests; here the sign rule
]
INT_ONLY = ["{0} & {1}", "{0} | {1}", "{0} ^ {1}", "{0} << 2", "{0} >> 1"]
UNARY_FLOAT = [
    "exp({0} / 4)",
    "log(abs({0}) + 1)",
    "sqrt(abs({0}))",
    "sin({0})",
    "cos({0})",
    "tan({0} / 4)",
    "sinh({0} / 2)",
    "cosh({0} / 2)",
    "tanh({0})",
    "asin({0} / 4)",
    "acos({0} / 4)",
    "atan({0})",
    "asinh({0})",
    "acosh(abs({0}) + 1)",
    "atanh({0} / 4)",
    "sigmoid({0})",
    "pow(abs({0}) + 1, 0.5)",
    "recip({0})",
    "builtin_binary_crossentropy(sigmoid({0}) * 0.5 + 0.25, {0}, 1)",
]


def _partner(draw, names: dict[str, tuple], shape: tuple) -> str:
    """A name whose shape broadcasts with ``shape``."""
    ok = []
    for n, s in names.items():
        try:
            np.broadcast_shapes(s, shape)
        except ValueError:
            continue
        ok.append(n)
    return draw(st.sampled_from(ok))


@st.composite
def chain(draw) -> Case:
    """Elementwise statements over every arithmetic, comparison, bit and float builtin."""
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shapes = {"X": (n, m), "Y": draw(st.sampled_from([(n, m), (m,), (1, m), (n, 1), ()]))}
    int_mode = draw(st.booleans())
    dtype = draw(st.sampled_from(INT_DTYPES if int_mode else FLOAT_DTYPES))
    # now and then Y has its own type, so every promotion rule meets the targets
    y_dtype = draw(st.sampled_from(INT_DTYPES if int_mode else FLOAT_DTYPES + INT_DTYPES[:1]))
    pool = UNARY_EXACT + BINARY_EXACT + (INT_ONLY if int_mode else []) + ([] if int_mode else UNARY_FLOAT)
    names, stmts, inexact = ["X", "Y"], [], False
    for k in range(draw(st.integers(1, 4))):
        template = draw(st.sampled_from(pool))
        inexact |= template in UNARY_FLOAT
        args = [draw(st.sampled_from(names)) for _ in range(2)]
        stmts.append(f"T{k} = {template.format(*args)};")
        names.append(f"T{k}")
    src = f"function (X, Y) -> ({names[-1]}) {{ {' '.join(stmts)} }}"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {"X": small_ints(rng, shapes["X"], dtype), "Y": small_ints(rng, shapes["Y"], y_dtype)}
    return Case("elementwise", src, inputs, exact=not inexact, ulps=8.0)


CASTS = ["as_uint({0}, 8)", "as_uint({0}, 16)", "as_uint({0}, 32)", "as_int({0}, 16)", "as_bool({0})",
         "ident({0})", "as_float({0}, 32)", "as_float({0}, 16)", "as_bfloat({0}, 16)", "round_tf32({0})"]


@st.composite
def structural(draw) -> Case:
    """Chains through the structural builtins — reshape (to and from 0-D), shape, gather and scatter
    (with indices out of range, which clamp), the row softmaxes, simple_reduce, a dropout-style mask
    from the PRNG (the state threaded through the steps) — and the casts (as_uint of negatives
    wraps)."""
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shapes: dict[str, tuple] = {"X": (n, m), "I": (draw(st.integers(1, 4)),)}
    dtype = draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    stmts, inexact, length, state = [], False, 1, "S"
    for k in range(draw(st.integers(1, 4))):
        name, pre = f"T{k}", ""
        a = draw(st.sampled_from([x for x, s in shapes.items() if x != "I"]))
        sa = shapes[a]
        ops = ["reshape", "shape", "cast", "binary", "prng"]
        ops += ["gather", "scatter", "simple_reduce"] if sa else []
        ops += ["softmax"] if len(sa) == 2 else []
        op = draw(st.sampled_from(ops))
        if op == "reshape":
            size = int(np.prod(sa))
            shapes_ = [(size,), (1, size), tuple(reversed(sa)) or (1,), (size, 1)]
            # one element: to 0-D as often as not (and from 0-D, when sa is ())
            new = draw(st.sampled_from([(), (), (1,), (1, 1)] if size == 1 else shapes_))
            expr, shape = f"reshape({a}{''.join(f', {d}' for d in new)})", new
        elif op == "simple_reduce":
            # trailing-aligned sizes, each 1 (summed) or kept; the leading dims are summed
            kept = sa[draw(st.integers(0, len(sa))) :]
            new = tuple(draw(st.sampled_from([1, d])) for d in kept)
            expr, shape = f"simple_reduce({a}{''.join(f', {d}' for d in new)})", new
            inexact, length = True, max(length, int(np.prod(sa)))  # float sums after casts may round
        elif op == "prng":
            pre = f"H{k} = prng_step({state}{''.join(f', {d}' for d in sa)}); S{k} = prng_state(H{k}); "
            expr, shape, state = f"prng_value(H{k}) < 0.5 ? {a} : {a} * 0", sa, f"S{k}"
        elif op == "shape":
            expr, shape = f"shape({a})", (len(sa),)
        elif op == "cast":
            expr, shape = draw(st.sampled_from(CASTS)).format(a), sa
        elif op == "binary":
            b = _partner(draw, {x: s for x, s in shapes.items() if x != "I"}, sa)
            expr = draw(st.sampled_from(BINARY_EXACT)).format(a, b)
            shape = np.broadcast_shapes(sa, shapes[b])
        elif op == "gather":
            idx = draw(st.sampled_from(["I"] + [x for x, s in shapes.items() if x != "I" and len(s) <= 2]))
            ix = idx if idx == "I" else f"as_int({idx}, 32)"
            expr, shape = f"gather({a}, {ix})", shapes[idx] + sa[1:]
        elif op == "scatter":
            like = draw(st.sampled_from([x for x, s in shapes.items() if s]))
            ix = draw(st.sampled_from([f"as_int({a}, 32)", f"index({a}, 0)"]))
            expr, shape = f"scatter({a}, {ix}, {like})", (shapes[like][0],)
            length = max(length, int(np.prod(sa)))  # duplicates add up
        else:
            fn = draw(st.sampled_from(["builtin_softmax", "builtin_logsoftmax"]))
            expr, shape, inexact = f"{fn}({a}, {sa[0]}, {sa[1]})", sa, True
            length = max(length, sa[1])
        if len(shape) > 4 or int(np.prod(shape)) > 256:
            break
        stmts.append(f"{pre}{name} = {expr};")
        shapes[name] = tuple(shape)
    assume(stmts)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {"X": small_ints(rng, shapes["X"], dtype), "I": small_ints(rng, shapes["I"], np.int32, -1, n)}
    if state != "S":  # taus88 seeds: components above 1, 7 and 15
        inputs["S"] = np.stack([rng.integers(lo, 2**32, 2048, dtype=np.uint32) for lo in (2, 8, 16)])
    last = stmts[-1].rsplit("; ", 1)[-1].split(" ")[0]  # after a PRNG step's own statements
    src = f"function ({', '.join(inputs)}) -> ({last}) {{ {' '.join(stmts)} }}"
    return Case("elementwise", src, inputs, exact=not inexact, ulps=16.0, length=length)


def _sweep_pool(dtype) -> list[str]:
    return UNARY_EXACT + BINARY_EXACT + CASTS + (INT_ONLY if np.dtype(dtype).kind in "iu" else [])


@st.composite
def elementwise_sweep(draw, large: bool = True, all_types: bool = True) -> Case:
    """Every exact elementwise builtin and cast at once on values that tell each from its
    neighbours (``conformance.sweeps``), in a float and an integer type; or only those that
    compute in one type (a device with few types runs them); as often as not at the large extents
    (``large``); with ``all_types``, every integer type's ``sweeps.INT_CORE`` and every float
    type's ``sweeps.CHAINS`` besides; now and then every float builtin on finite values, with the
    row softmaxes and ``simple_reduce`` (``sweeps.ROW_FUNCTIONS``)."""
    seed = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 3)) == 3:
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        src, inputs = sweeps.transcendental_program(dtype, seed, UNARY_FLOAT + sweeps.ROW_FUNCTIONS)
        # (the row functions sum a row: within its length; the math-accuracy family bounds each
        # function's own ulps)
        return Case("elementwise", src, inputs, exact=False, ulps=8.0, length=sweeps.COLS)
    dtype = draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    closed = draw(st.integers(0, 3)) == 3  # a quarter (the first example: everything at once)
    large = large and draw(st.booleans())
    if closed:
        src, inputs = sweeps.elementwise_program(dtype, seed, _sweep_pool(dtype), True, large)
    else:  # a float type and an integer type in one program: every template of each
        other = draw(st.sampled_from(INT_DTYPES if np.dtype(dtype).kind == "f" else FLOAT_DTYPES))
        also = (other, _sweep_pool(other))
        src, inputs = sweeps.elementwise_program(
            dtype, seed, _sweep_pool(dtype), False, large, also, all_types
        )
    return Case("elementwise", src, inputs)


def elementwise(large: bool = True, all_types: bool = True) -> st.SearchStrategy[Case]:
    """Chains, structural chains, or the sweep (``large``: now and then at ``sweeps.LARGE``;
    ``all_types``: with every integer and float type)."""
    # (the sweep last: a failure shrinks away from it)
    return st.one_of(chain(), structural(), elementwise_sweep(large, all_types))

