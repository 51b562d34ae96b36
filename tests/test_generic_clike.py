"""Shape-generic kernels on the C-like targets (``backends.clike.generic``, the ``generic`` setting):
on ``opencl_cpu.0`` a kernel equal up to integers to one built before runs one program per bucket,
its integers as arguments, so a program called at many lengths compiles a bounded number of
programs; answers equal the interpreter's on integer-valued inputs (a softmax: the specialized
build's, bit for bit). The CUDA dialect's generic source compiles with ``nvcc`` for sm_90.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import driver, registry, symbolic
from backends.clike import generic
from stripe.ir import Block, Dim, Index, RefDir, Refinement, TensorShape
from tile.affine import Affine
from tile.dtypes import DType
from tile.parser import parse

CHAIN = "function (A[N, D], B[N, D]) -> (C) { C = A * B + A * A - B; }"
SOFTMAX = "function (X[N, D]) -> (P) { P = builtin_softmax(X, N, D); }"
ROWS = "function (A[N, D]) -> (S) { S[i: N] = +(A[i, d] * A[i, d]); }"
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"


def _opencl():
    if "opencl_cpu.0" not in registry.devices():
        pytest.skip(f"no opencl_cpu.0 here: {registry.unavailable() or 'no OpenCL CPU device'}")
    dev = registry.get("opencl_cpu.0")
    dev.compiler.generic.clear()
    return dev


def _compiled() -> int:
    from backends.opencl.compiler import COMPILED

    return COMPILED[0]


def _ints(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-4, 5, size=shape).astype(np.float32)


def _run(src: str, exe, shape, seed: int) -> tuple[dict, dict]:
    ins = [_ints(shape, seed + k) for k in range(src.count("[N, D]"))]
    return exe(*ins), tile.compile(src, "interp")(*ins)


@pytest.mark.parametrize("src", [CHAIN, ROWS], ids=["chain", "row sum"])
def test_many_lengths_compile_three_programs_and_equal_the_interpreter(src):
    _opencl()
    exe = tile.compile(src, "opencl_cpu.0", {"generic": True, "cache": False})
    before = _compiled()
    shapes = [(5, 16), (7, 16), (9, 16), (33, 16), (2, 16), (12, 20), (3, 3)]
    for k, shape in enumerate(shapes):
        got, want = _run(src, exe, shape, k)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{shape}")
        lib = exe._last.library
        if k >= 1:  # the first is built specialized, every later one runs the template
            assert lib.extra["generic"]["kernels"] == len(lib.kernels), (shape, lib.extra["names"])
    # the first length's program, the template of N (its row length 16 fixed), the template widened
    # at the first other row length: no program for the other four shapes
    assert _compiled() - before == 3


RUN_TIME = {  # an access offset, a constraint's bound, a window's range, strides: all from N (and M)
    "reverse": "function (A[N]) -> (B) { B[i: N] = =(A[N - 1 - i]); }",
    "prefix": "function (A[N]) -> (B) { B[i: N] = +(A[i - j]), j < N; }",
    "window": "function (A[N]) -> (B) { B[i: N - 2] = +(A[i + k]), k < 3; }",
    "transpose": "function (A[N, M]) -> (B) { B[j, i: M, N] = =(A[i, j]); }",
}


@pytest.mark.parametrize("name", sorted(RUN_TIME))
def test_offsets_bounds_and_strides_at_run_time_equal_the_interpreter(name):
    _opencl()
    src = RUN_TIME[name]
    exe = tile.compile(src, "opencl_cpu.0", {"generic": True, "cache": False})
    for k, n in enumerate((5, 8, 11, 40)):
        a = _ints((n,) if "M]" not in src else (n, n + 3), n)
        got, want = exe(a), tile.compile(src, "interp")(a)
        np.testing.assert_array_equal(got["B"], want["B"], err_msg=f"N = {n}")
        lib = exe._last.library
        if k >= 1:
            assert lib.extra["generic"]["kernels"] == len(lib.kernels), lib.extra["names"]
        if k >= 2:
            assert lib.extra["generic"]["built"] == 0


def test_a_kernel_the_same_at_every_length_is_built_once():
    """A row sum at one row count and many row lengths: its zero fill is the same kernel at every
    length, a form without run-time integers, built once with the sum's template."""
    dev = _opencl()
    exe = tile.compile(ROWS, "opencl_cpu.0", {"generic": True, "cache": False})
    before = _compiled()
    for k, d in enumerate((5, 9, 13, 30)):
        got, want = _run(ROWS, exe, (8, d), k)
        np.testing.assert_array_equal(got["S"], want["S"])
        if k >= 1:
            assert exe._last.library.extra["generic"]["kernels"] == 2
    assert _compiled() - before == 2  # the first length's program, the two forms' program
    assert any(b.form is not None and b.form.slots == 0 for b in dev.compiler.generic.buckets.values())


def test_a_softmax_at_many_lengths_is_one_program_bit_equal_to_specialized():
    _opencl()
    gen = tile.compile(SOFTMAX, "opencl_cpu.0", {"generic": True, "cache": False})
    spec = tile.compile(SOFTMAX, "opencl_cpu.0", {"cache": False})
    gen(_ints((4, 16), 0))  # the bucket's first kernel: specialized
    before = _compiled()
    shapes = [(5, 20), (9, 16), (64, 16), (3, 7), (17, 33), (2, 2)]
    for k, shape in enumerate(shapes):
        x = _ints(shape, k)
        got, same = gen(x)["P"], spec(x)["P"]
        assert gen._last.library.extra["generic"]["kernels"] == 1
        np.testing.assert_array_equal(got, same, err_msg=f"{shape}: generic differs from specialized")
        want = tile.compile(SOFTMAX, "interp")(x)["P"]
        tol = 8 * shape[1] * np.finfo(np.float32).eps
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # the template (one program, once, at the first length that differs), and the specialized builds
    assert _compiled() - before == 1 + len(shapes)


ROW_SOFTMAX = ("function (A[N, M]) -> (B) { R[n, 0: N, 1] = >(A[n, m]); E = exp(A - R); "
               "S[n, 0: N, 1] = +(E[n, m]); B = E / S; }")


def test_row_programs_bucket_by_work_group_and_equal_specialized_bit_for_bit():
    """A softmax written in Tile is a ``row_fusion`` row program from N = 9 rows on: one work-group
    per row, its size the largest power of two at most 64 and the row's length. Rows of at least
    64 share one template, shorter ones one per power of two; the tree each runs is its specialized
    kernel's, so the results are the specialized build's bit for bit. (``row_fusion`` asks for 4
    rows a compute unit: the row counts below are for 2 units, scaled up on a larger device.)"""
    dev = _opencl()
    gen = tile.compile(ROW_SOFTMAX, "opencl_cpu.0", {"generic": True, "cache": False})
    spec = tile.compile(ROW_SOFTMAX, "opencl_cpu.0", {"cache": False})
    more = -(-int(dev.cl_device.max_compute_units) // 2)
    shapes = [(9 * more, 64), (11 * more, 80), (13 * more, 100), (40 * more, 257), (20 * more, 30),
              (21 * more, 31), (60 * more, 17), (10 * more, 1000)]
    rows = []
    for k, shape in enumerate(shapes):
        x = _ints(shape, k)
        got = gen(x)["B"]
        np.testing.assert_array_equal(got, spec(x)["B"], err_msg=f"{shape}")
        want = tile.compile(ROW_SOFTMAX, "interp")(x)["B"]
        tol = 8 * shape[1] * np.finfo(np.float32).eps
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        lib = gen._last.library
        assert type(lib.kernels[0].block.plan).__name__ == "RowPlan", shape
        rows.append((lib.extra["local_sizes"][0], bool(lib.extra["generic"]["kernels"])))
    assert [w for w, _ in rows] == [64, 64, 64, 64, 16, 16, 16, 64]
    # generic from each bucket's second length on: W = 64's from (11, 80), W = 16's from (21, 31)
    assert [g for _, g in rows] == [False, True, True, True, False, True, True, True]
    assert dev.compiler.generic.generated <= 2 + 1  # two templates, W = 16's widened once at M = 17


def test_a_template_answers_alike_whichever_lengths_built_it():
    dev = _opencl()
    x = _ints((13, 16), 7)
    outs = []
    for first in ((5, 9), (21, 2)):
        dev.compiler.generic.clear()
        exe = tile.compile(ROWS, "opencl_cpu.0", {"generic": True, "cache": False})
        for n in first:
            exe(_ints((n, 16), n))
        outs.append(exe(x)["S"])
        assert exe._last.library.extra["generic"]["built"] == 0  # bound, not built
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], tile.compile(ROWS, "interp")(x)["S"])


def test_an_integer_the_template_fixed_widens_it_at_most_max_builds():
    dev = _opencl()
    exe = tile.compile(ROWS, "opencl_cpu.0", {"generic": True, "cache": False})
    for shape in [(5, 16), (7, 16)]:  # a template of N, its row length 16 fixed
        exe(_ints(shape, 1))
    sums = [b for b in dev.compiler.generic.buckets.values() if b.form is not None and b.form.slots]
    assert sums and all(b.builds == 1 for b in sums)
    got, want = _run(ROWS, exe, (6, 24), 3)  # another row length: the template widens
    np.testing.assert_array_equal(got["S"], want["S"])
    assert exe._last.library.extra["generic"]["built"] >= 1
    assert max(b.builds for b in dev.compiler.generic.buckets.values()) <= generic.MAX_BUILDS
    for k, shape in enumerate([(8, 40), (3, 5)]):  # both now run the widened template
        got, want = _run(ROWS, exe, shape, k)
        np.testing.assert_array_equal(got["S"], want["S"])
        assert exe._last.library.extra["generic"]["built"] == 0


def test_tiled_products_stay_specialized():
    _opencl()
    exe = tile.compile(MATMUL, "opencl_cpu.0", {"generic": True, "cache": False})
    for n in (40, 48, 56):
        a, b = _ints((n, n), n), _ints((n, n), n + 1)
        np.testing.assert_array_equal(exe(a, b)["C"], a @ b)
        assert exe._last.library.extra["generic"]["kernels"] == 0  # its tiles follow the extents


# ------------------------------------------------------------------ templates (no device)
def _square(n: int) -> Block:
    """A kernel over an n x n buffer: its size, stride and range all n."""
    shape = TensorShape(DType.FLOAT32, (Dim(n, n), Dim(n, 1)))
    ref = Refinement(dir=RefDir.OUT, into="B", access=(Affine.var("i"), Affine.var("j")), shape=shape,
                     agg_op="assign")
    return Block(name="k", idxs=(Index("i", n), Index("j", n)), constraints=(), refs=(ref,), stmts=())


def test_merged_slots_are_one_object_and_bind_only_where_they_agree():
    raw = symbolic.unify(_square(5), _square(7))
    assert symbolic.slots(raw) > 1  # one slot per place
    t = symbolic.merged(raw, [_square(5), _square(7)])
    assert symbolic.slots(t) == 1
    ref = t.refs[0]
    assert ref.shape.dims[0].size is ref.shape.dims[0].stride is t.idxs[0].range  # one object
    assert symbolic.bind(t, _square(11)) == [11]
    text, ints = symbolic.flat(_square(11))
    assert symbolic.matches(symbolic.flat(t)[1], ints) == [11]
    odd = Block(name="k", idxs=(Index("i", 11), Index("j", 11)), constraints=(), refs=(_square(12).refs[0],),
                stmts=())
    assert symbolic.bind(t, odd) is None  # 11 and 12 in places of one slot
    assert symbolic.matches(symbolic.flat(t)[1], symbolic.flat(odd)[1]) is None
    assert symbolic.bind(raw, odd) is not None  # the unmerged template takes it (what widens)


# ------------------------------------------------------------------ CUDA (no GPU: nvcc)
def _stand_in():
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_cuda_device import _stand_in as make
    finally:
        sys.path.pop(0)
    return make()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here (the CUDA toolkit is not installed)")
@pytest.mark.parametrize("src", [CHAIN, SOFTMAX, ROWS, ROW_SOFTMAX], ids=["chain", "softmax", "sum", "rows"])
def test_generic_cuda_source_compiles_for_sm90(src, tmp_path):
    dev = _stand_in()
    lib = None
    for n, d in ((40, 64), (48, 80)):
        ins = {k: np.ones((n, d), np.float32) for k in ("A", "B", "X") if f"{k}[N, " in src}
        bound = driver.bind_inputs(parse(src), ins)
        lib = driver.build(bound, dev, {"generic": True, "cache": False}).library
    uses = lib.extra["generic"]["uses"]
    assert len(uses) == len(lib.kernels) and all(u.built for u in uses.values())
    module = next(iter(uses.values())).form.program
    assert "const long tile_n0" in module.source and b".entry tile_g0" in module.ptx
    path = tmp_path / "generic.cu"
    path.write_text(module.source)
    out = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "--fmad=false", "-std=c++17", "-o",
                          str(tmp_path / "generic.cubin"), str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here (the CUDA toolkit is not installed)")
def test_a_cuda_library_with_generic_kernels_is_rebuilt_not_restored(tmp_path, monkeypatch):
    """The program cache (``backends.progcache``) restores a CUDA library from its snapshot; one
    with generic kernels names forms of this process's buckets, so a new process builds it."""
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    dev = _stand_in()
    libs = []
    for n in (5, 7):
        bound = driver.bind_inputs(parse(SOFTMAX), {"X": np.ones((n, 16), np.float32)})
        libs.append(driver.build(bound, dev, {"generic": True}).library)
    first, second = (dev.compiler.snapshot(lib) for lib in libs)
    assert not first["generic"] and second["generic"]
    assert dev.compiler.restore(libs[0].kernels, {"generic": True}, first) is not None
    assert dev.compiler.restore(libs[1].kernels, {"generic": True}, second) is None


# ---------------------------------------------------- every C-like device (GPUs: on the device machine)
@pytest.mark.parametrize("device_id", ["opencl_cpu.0", "opencl_gpu.0", "cuda.0"])
@pytest.mark.parametrize("src", [CHAIN, SOFTMAX, ROWS], ids=["chain", "softmax", "row sum"])
def test_generic_kernels_on_each_device_equal_the_interpreter(device_id, src):
    if device_id not in registry.devices():
        why = registry.unavailable()
        reason = why.get(device_id.split(".")[0]) or why.get(device_id) or "no such device"
        pytest.skip(f"no {device_id} here: {reason}")
    dev = registry.get(device_id)
    dev.compiler.generic.clear()
    exe = tile.compile(src, device_id, {"generic": True, "cache": False})
    for k, shape in enumerate([(300, 16), (301, 16), (302, 16), (2049, 33), (2050, 33), (5, 16), (3, 3)]):
        x = [_ints(shape, k + j) for j in range(max(1, src.count("[N, D]")))]
        got, want = exe(*x), tile.compile(src, "interp")(*x)
        for name in want:
            if src == SOFTMAX:  # exp: within a few units of roundoff a row element
                tol = 8 * shape[1] * np.finfo(np.float32).eps
                np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=f"{shape}")
            else:
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{shape}")
        if shape == (302, 16):  # its bucket's third length: bound, nothing built
            lib = exe._last.library
            assert lib.extra["generic"]["kernels"] == len(lib.kernels), lib.extra["names"]
            assert lib.extra["generic"]["built"] == 0


def test_conformance_checks_bound_generic_kernels():
    """The conformance check (``conformance.test_conformance.check``) under ``--generic``'s setting
    runs the bound templates and compares them with the interpreter: a family's program drawn at
    three sizes builds once specialized, once as a template, and binds the third. (That the drawn
    families repeat programs at other sizes is what ``pytest conformance/ --generic`` says in its
    summary: templates generated and kernels bound to one built before.)"""
    from conformance.case import Case, small_ints
    from conformance.targets import Subject
    from conformance.test_conformance import check

    dev = _opencl()
    subject = Subject(dev.id, dev, settings={"generic": True})
    src = "function (A[N, M], B[M]) -> (C) { C = max(A, B) * A - 2; }"
    rng = np.random.default_rng(0)
    for n, m in ((3, 5), (4, 5), (9, 5)):
        check(Case("elementwise", src, {"A": small_ints(rng, (n, m), np.float32),
                                        "B": small_ints(rng, (m,), np.float32)}), subject)
    reg = dev.compiler.generic
    assert reg.generated == 1 and reg.bound == 1, (reg.generated, reg.bound)
