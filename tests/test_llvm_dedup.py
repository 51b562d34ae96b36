"""Kernels alike up to names are generated once per program (``backends.llvm.dedup``) and each
duplicate calls the shared function with its own buffers; results stay the interpreter's."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.driver import bind_inputs, build, kernels
from backends.llvm import codegen
from backends.llvm.dedup import unit_key
from backends.registry import devices

MATMULS = """function (A[N, N], B[N, N], C[N, N], D[N, N]) -> (P, Q, R, S) {
  P[i, j: N, N] = +(A[i, l] * B[l, j]);
  Q[i, j: N, N] = +(C[i, l] * D[l, j]);
  R[i, j: N, N] = +(B[i, l] * C[l, j]);
  S[i, j: N, N] = +(D[i, l] * A[l, j]);
}"""

CHAIN = """function (A[N, N], B[N, N]) -> (T5) {
  T0 = A + B;
  T1[i, j: N, N] = +(T0[i, l] * B[l, j]);
  T2 = T1 + A;
  T3[i, j: N, N] = +(T2[i, l] * A[l, j]);
  T4 = T3 + B;
  T5[i, j: N, N] = +(T4[i, l] * B[l, j]);
}"""


def _inputs(names, n=8, seed=0):
    rng = np.random.default_rng(seed)
    return {x: rng.integers(-3, 4, (n, n)).astype(np.float32) for x in names}


@pytest.fixture
def builds(monkeypatch):
    """Counts the kernel functions code generation builds."""
    count = [0]
    real = codegen.KernelCodegen.build

    def counted(self):
        count[0] += 1
        return real(self)

    monkeypatch.setattr(codegen.KernelCodegen, "build", counted)
    return count


@pytest.mark.parametrize("src, names", [(MATMULS, "ABCD"), (CHAIN, "AB")], ids=["matmuls", "chain"])
def test_alike_kernels_are_built_once_and_run_on_their_own_buffers(src, names, builds):
    x = _inputs(names)
    want = tile.compile(src, "interp")(x)
    exe = tile.compile(src, "llvm_cpu.0", {"cache": False})
    cp = exe.prepare(**x)
    lib = cp.library
    n = len(lib.kernels)
    distinct = lib.extra["distinct_kernels"]
    assert distinct < n, f"{n} kernels, none shared"
    assert builds[0] == distinct, "a shared kernel was generated again"
    assert len(set(lib.extra["built_as"])) == distinct
    got = exe(x)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)


def test_many_matmuls_build_one_contraction(builds):
    src = "function (A[N, N], B[N, N]) -> (" + ", ".join(f"C{k}" for k in range(20)) + ") {\n"
    src += "\n".join(f"  C{k}[i, j: N, N] = +(A[i, l] * B[l, j]);" for k in range(20)) + "\n}"
    x = _inputs("AB")
    lib = tile.compile(src, "llvm_cpu.0", {"cache": False}).prepare(**x).library
    assert len(lib.kernels) >= 20
    assert lib.extra["distinct_kernels"] <= 2  # a zero fill and the product (or the two as one unit)
    got = tile.compile(src, "llvm_cpu.0", {"cache": False})(x)
    want = x["A"] @ x["B"]
    for k in range(20):
        np.testing.assert_array_equal(got[f"C{k}"], want)


def _keys(src, x):
    """The dedup key of each kernel of ``src`` optimized for ``x``."""
    b = build(bind_inputs(tile.parse(src), x), devices()["llvm_cpu.0"], {"cache": False})
    return [unit_key([info], [{}]) for info in kernels(b.program)]


def test_keys_ignore_names_and_follow_what_matters():
    one = "function (A[N, N], B[N, N]) -> (C) { C[i, j: N, N] = +(A[i, l] * B[l, j]); }"
    renamed = "function (X[N, N], Yy[N, N]) -> (Out) { Out[r, s: N, N] = +(X[r, t] * Yy[t, s]); }"
    x = _inputs("AB")
    k1 = _keys(one, x)
    assert _keys(renamed, {"X": x["A"], "Yy": x["B"]}) == k1
    assert _keys(one, _inputs("AB", n=16)) != k1, "another shape must not share a kernel"
    x64 = {k: v.astype(np.float64) for k, v in x.items()}
    assert _keys(one, x64) != k1, "another dtype must not share a kernel"
    larger = one.replace("+(A[i, l] * B[l, j])", ">(A[i, l] * B[l, j])")
    assert _keys(larger, x) != k1, "another aggregation must not share a kernel"


def test_buffer_order_is_part_of_the_key():
    """``A - B`` and ``B - A`` are the same block up to names only if the table order is ignored."""
    src = "function (A[N], B[N]) -> (C, D) { C = A - B; D = B - A; }"
    x = {"A": np.arange(8, dtype=np.float32), "B": np.ones(8, np.float32) * 3}
    want = tile.compile(src, "interp")(x)
    got = tile.compile(src, "llvm_cpu.0", {"cache": False})(x)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)


def test_renamed_program_hits_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    one = "function (A[N, N], B[N, N]) -> (C) { C[i, j: N, N] = +(A[i, l] * B[l, j]); }"
    renamed = "function (X[N, N], Yy[N, N]) -> (Out) { Out[r, s: N, N] = +(X[r, t] * Yy[t, s]); }"
    x = _inputs("AB")
    first = tile.compile(one, "llvm_cpu.0").prepare(**x).library
    again = tile.compile(renamed, "llvm_cpu.0").prepare(X=x["A"], Yy=x["B"]).library
    assert first.extra["cache"] == "miss"
    assert again.extra["cache"] == "hit", "a program differing only in names compiled again"
    other = tile.compile(one, "llvm_cpu.0", {"opt": 1}).prepare(**x).library
    assert other.extra["cache"] == "miss", "another setting must not share the object code"


KERNEL = """0: #kernel block [{ix}:8] (
    in A[{ix}] fp32(1:1)
    out C[{ix}]:assign fp32(1:1)
) {{
  0: $a = load(A)
  1: $v = {op}($a, $a):fp32
  2: C = store($v)
}}
"""


def test_an_index_spelled_like_an_operation_is_no_name_there():
    """``mul(`` is an operation even in a kernel with an index called ``mul``: renaming it with the
    index would make this product's key equal to a sum's whose index is called ``add``."""
    from backends.hal import KernelInfo
    from stripe.parser import parse_stripe

    def key(ix, op):
        block = parse_stripe(KERNEL.format(ix=ix, op=op))
        return unit_key([KernelInfo("k", block, ("A", "C"), ("float32", "float32"))], [{}])

    assert key("mul", "mul") != key("add", "add")
    assert key("mul", "mul") == key("q", "mul")
