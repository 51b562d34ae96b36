"""The builtin programs shared by the LLVM and OpenCL builtin tests; not a test module.

One program per builtin applies it to a batch of dtype combinations (one output each). Inputs are
integer-valued with each type's extremes mixed in, and for floats 0, ±inf, nan, halves and values
that overflow narrower types, so conversions, wrap-around, division by zero, nan propagation and
rounding are all exercised. ``STRUCTURAL`` holds one program per structural builtin and
``float16_case`` the float16 conversions and arithmetic.
"""

from __future__ import annotations

import numpy as np

from tests.taus88 import reference, seed_state
from tile.builtins import BUILTINS

RNG = np.random.default_rng(11)
ALL = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
ALL += ["float16", "float32", "float64"]
FLOATS = ("float16", "float32", "float64")
MIXED = [("int8", "uint32"), ("uint32", "int32"), ("float16", "int64"), ("uint8", "int8")]
MIXED += [("int32", "float64"), ("bool", "int8"), ("uint64", "int64"), ("float32", "float16")]
COND = [("int8", "float32", "int16"), ("float64", "uint8", "int64"), ("bool", "float16", "float16")]
COND += [("float32", "int32", "uint32"), ("uint64", "bool", "bool"), ("float16", "float64", "int8")]
BITS = {"bit_and", "bit_or", "bit_xor", "bit_not", "bit_left", "bit_right"}
WIDTHS = {"as_float": (16, 32, 64), "as_int": (8, 16, 32, 64), "as_uint": (8, 16, 32, 64)}
WIDTHS["builtin_binary_crossentropy"] = (24,)  # its n (unused by the value)
WIDTHS["as_bfloat"] = (16,)  # every type to bfloat16 (the extremes and edges round once)
SHAPES = [(4, 6), (6,), (4, 1)]
FLOAT_EDGES = [0.0, np.inf, -np.inf, np.nan, 300.75, -1e4, 2.5, -2.5, 0.5, -0.5, 1e10, 7e4, -129.0]


def values(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        v = RNG.integers(max(int(info.min), -6), 7, shape).astype(dt)
        edges = [info.min, info.max, 0, 1, info.max - 1] + ([-1, info.min + 1] if dt.kind == "i" else [])
    else:
        v = RNG.integers(-6, 7, shape).astype(dt)
        edges = FLOAT_EDGES
    flat = v.reshape(-1)
    with np.errstate(over="ignore"):
        for k, e in enumerate(edges[: (flat.size + 1) // 2]):
            flat[2 * k] = np.asarray(e).astype(dt)
    return v


def combos(name: str) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """(operand dtypes, params) cases of one builtin."""
    n = BUILTINS[name].tensors
    if n == 3:
        out = COND
    elif n == 2:
        out = [(d, d) for d in ALL] + MIXED
    else:
        out = [(d,) for d in ALL]
    if name in BITS:
        out = [c for c in out if not any(d in FLOATS for d in c)]
    params = [(w,) for w in WIDTHS.get(name, ())] or [()]
    return [(c, p) for c in out for p in params]


def program(name: str, cases) -> tuple[str, dict]:
    ins, stmts, outs = {}, [], []
    for k, (dts, params) in enumerate(cases):
        args = []
        for t, dt in enumerate(dts):
            arg = f"{'ABC'[t]}{k}"
            ins[arg] = values(dt, SHAPES[t])
            args.append(arg)
        stmts.append(f"O{k} = {name}({', '.join(args + [str(p) for p in params])});")
        outs.append(f"O{k}")
    src = f"function ({', '.join(ins)}) -> ({', '.join(outs)}) {{\n  " + "\n  ".join(stmts) + "\n}"
    return src, ins


ELEMENTWISE = [n for n in BUILTINS if n not in ("index", "shape", "reshape", "gather", "scatter")]
ELEMENTWISE = [n for n in ELEMENTWISE if n not in ("prng_step", "prng_value", "prng_state", "simple_reduce")]
ELEMENTWISE = [n for n in ELEMENTWISE if n not in ("builtin_softmax", "builtin_logsoftmax")]

_DRAW = "H = prng_step(S, 3, 1000); V = prng_value(H); T = prng_state(H);"
STRUCTURAL = [
    ("prng_step", f"function (S) -> (V, T) {{ {_DRAW} }}", {"S": ("uint32", (3, 2048))}),
    ("prng_value", "function (S) -> (V, T) { H = prng_step(S); V = prng_value(H); T = prng_state(H); }",
     {"S": ("uint32", (3, 2048))}),
    (
        "prng_state",  # two steps in a row: the second draws from the state the first returns
        f"function (S) -> (V, W, U) {{ {_DRAW} H2 = prng_step(T, 2049); W = prng_value(H2); "
        "U = prng_state(H2); }",
        {"S": ("uint32", (3, 2048))},
    ),
    (
        "simple_reduce",
        "function (A[N, M, K]) -> (O, P, Q) { O = simple_reduce(A, 1, K); P = simple_reduce(A, M, 1); "
        "Q = simple_reduce(A); }",
        {"A": ("int16", (2, 3, 4))},
    ),
    ("index", "function (A[N, M]) -> (O) { O = index(A, 0) * 10 + index(A, 1); }", {"A": ("int8", (3, 4))}),
    ("shape", "function (A) -> (O, P) { O = shape(A); P = shape(O) + 1; }", {"A": ("float16", (2, 0, 5))}),
    (
        "reshape",
        "function (A) -> (O, P) { O = reshape(A, 6, 2); P = reshape(A, 12); }",
        {"A": ("uint64", (3, 4))},
    ),
    (
        "gather",
        "function (D, I) -> (O) { O = gather(D, I); }",
        {"D": ("float16", (5, 3)), "I": ("int64", (2, 3))},
    ),
    (
        "scatter",
        "function (V, I, L) -> (O) { O = scatter(V, I, L); }",
        {"V": ("int16", (6, 2)), "I": ("uint8", (6,)), "L": ("bool", (5, 9))},
    ),
    (
        "builtin_softmax",
        "function (X[R, C]) -> (O) { O = builtin_softmax(X, R, C); }",
        {"X": ("int8", (1, 1))},
    ),
    (
        "builtin_logsoftmax",
        "function (X[R, C]) -> (O) { O = builtin_logsoftmax(X, R, C); }",
        {"X": ("float64", (3, 1))},
    ),
]


def float16_case() -> tuple[str, dict[str, np.ndarray]]:
    """float16 from and to every type (single roundings, subnormals, overflow to inf) and float16
    arithmetic; ``O3[-5]`` is 65519.9 (rounds down to 65504) and ``O3[-4]`` 65520 (up to inf)."""
    src = """function (H, G, I, U, D, F, B) -> (O1, O2, O3, O4, O5, O6, O7, O8, O9, O10) {
        O1 = as_float(I, 16); O2 = as_float(U, 16); O3 = as_float(D, 16); O4 = as_float(F, 16);
        O5 = as_float(B, 16); O6 = as_int(H, 8); O7 = as_uint(H, 64); O8 = as_float(H, 64);
        O9 = H / G + sqrt(H); O10 = round(H * 0.3);
    }"""
    tiny = [6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 65504, 65519.9, 65520, -3e-6, 1.00048828125, 1.000732421875]
    ins = {
        "H": np.concatenate([values("float16", (24,)), np.float16([6.1e-5, 5.96e-8, 65504, -3e-6])]),
        "G": values("float16", (28,)),
        "I": values("int32", (28,)),
        "U": values("uint64", (28,)),
        "D": np.concatenate([values("float64", (18,)), tiny]),
        "F": np.concatenate([values("float32", (18,)), np.float32(tiny)]),
        "B": values("bool", (28,)),
    }
    return src, ins


def structural_inputs(name: str, spec: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The inputs of a ``STRUCTURAL`` program (scatter's values from ``rng``, wide enough to wrap)."""
    ins = {k: values(dt, shape) for k, (dt, shape) in spec.items()}
    if name == "scatter":
        ins["V"] = rng.integers(-1000, 1000, (6, 2)).astype(np.int16)  # int16 sums wrap
    if name.startswith("prng_"):
        ins["S"] = seed_state(int(rng.integers(1000)))
    return ins


def check_structural(name: str, ins: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    """The closed forms: gather and scatter clamp their indices, and a one-column logsoftmax is
    log(1) == 0 exactly, except inf - inf."""
    if name == "gather":
        np.testing.assert_array_equal(got["O"], ins["D"][np.clip(ins["I"], 0, 4)])
    if name == "scatter":
        want = np.zeros((5, 2), np.int16)
        np.add.at(want, np.clip(ins["I"].astype(np.int64), 0, 4), ins["V"])
        np.testing.assert_array_equal(got["O"], want)
    if name == "simple_reduce":
        a = ins["A"]
        np.testing.assert_array_equal(got["O"], a.sum(axis=(0, 1), dtype=np.int16).reshape(1, 4))
        np.testing.assert_array_equal(got["P"], a.sum(axis=(0, 2), dtype=np.int16).reshape(3, 1))
        np.testing.assert_array_equal(got["Q"], a.sum(dtype=np.int16))
    if name.startswith("prng_"):
        shape = () if name == "prng_value" else (3, 1000)
        v, t = reference(ins["S"], shape)
        np.testing.assert_array_equal(got["V"], v)
        if name == "prng_state":
            w, u = reference(t, (2049,))
            np.testing.assert_array_equal(got["W"], w)
            np.testing.assert_array_equal(got["U"], u)
        else:
            np.testing.assert_array_equal(got["T"], t)
    if name == "builtin_logsoftmax":
        x = ins["X"]
        np.testing.assert_array_equal(got["O"], np.where(np.isfinite(x), 0.0, np.nan))
