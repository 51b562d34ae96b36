"""The OpenCL backend on whole Tile programs and through its HAL: equal to the interpreter.

Programs go through ``tile.compile(src, <device>)`` (``opencl_cpu.0`` when present: PoCL) and are
compared exactly with ``ref_interp.run`` on integer-valued inputs, plus closed forms from numpy
where they exist; where the order of float operations is the point, on random floats against the
Stripe interpreter. The HAL part checks device enumeration and capabilities, the asynchronous
build and its disk cache, buffers, copies, dependencies and profiled events, and the refusal of
types a device lacks. The builtins are in ``test_opencl_builtins.py``.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pyopencl as cl
import pytest

import ref_interp
import tile
from backends.clike import CTarget, generate
from backends.clike.helpers import helper_source
from backends.driver import compile_bound
from backends.hal import Event, KernelInfo
from backends.opencl import DeviceTypeError, OpenCLDevice, discover
from backends.opencl.executor import CLBuffer, CLEvent
from ref_interp.stripe_exec import run_stripe
from tests.llvm_runner import buffer_names, lowered
from tests.opencl_support import DEVICE_ID, assert_same, check, device, ints, requires_opencl, run
from tests.test_llvm_backend import CONV_PAD, CONV_STRIDED, _strided_windows, conv_same
from tests.test_transforms import SEED, SEED_SHAPES, seed_expected
from tile.autodiff import gradient
from tile.bind import bind
from tile.dtypes import DType
from tile.errors import TileTypeError
from tile.inputs import input_types

pytestmark = [requires_opencl, pytest.mark.usefixtures("private_cache")]
RNG = np.random.default_rng(5)


def build(src: str, inputs: dict, settings: dict | None = None, dev=None):
    prog = tile.parse(src)
    return compile_bound(bind(prog, input_types(prog, inputs)), dev or device(), settings)


# ----------------------------------------------------------------------------- devices
def test_devices_are_every_opencl_device_by_kind_in_platform_order():
    unusable: dict[str, str] = {}
    found = {d.id: d for d in discover(unusable)}
    expect, counts = [], {}
    for p in cl.get_platforms():
        for d in p.get_devices():
            kinds = [
                (cl.device_type.GPU, "gpu"),
                (cl.device_type.CPU, "cpu"),
                (cl.device_type.ACCELERATOR, "accelerator"),
            ]
            kind = next((name for flag, name in kinds if d.type & flag), "other")
            expect.append((f"opencl_{kind}.{counts.get(kind, 0)}", d))
            counts[kind] = counts.get(kind, 0) + 1
    assert set(found) | set(unusable) == {i for i, _ in expect} and DEVICE_ID in found
    for dev_id, d in expect:
        if dev_id in found:
            dev = found[dev_id]
            assert dev.name == d.name.strip() and dev.name in dev.description
            assert dev.fp64 == bool(d.double_fp_config) and dev.fp16  # float16 needs no extension
            assert dev.half_extension == ("cl_khr_fp16" in d.extensions)
            caps = dev.capabilities
            assert caps.supports(DType.INT8) and caps.supports(DType.FLOAT16) == dev.fp16
            assert caps.supports(DType.FLOAT64) == dev.fp64


def test_a_device_that_cannot_compile_is_left_out_with_the_reason(monkeypatch):
    monkeypatch.setattr(OpenCLDevice, "probe", lambda self: "its compiler is broken")
    unusable: dict[str, str] = {}
    assert discover(unusable) == [] and DEVICE_ID in unusable
    assert "its compiler is broken" in unusable[DEVICE_ID]


def test_library_source_and_debug_print(monkeypatch, capsys):
    monkeypatch.setenv("TILE_DEBUG", "3")
    got = run("function (A[N]) -> (O) { O = A * 2 + 1; }", {"A": np.arange(5, dtype=np.float32)})
    np.testing.assert_array_equal(got["O"], np.arange(5) * 2 + 1)
    out = capsys.readouterr().out
    assert "__kernel void tile_k0_" in out and "get_global_id(0)" in out and "FP_CONTRACT OFF" in out


# -------------------------------------------------------- aggregations x combinations
AGGS = ["+", "*", ">", "<", "="]
COMBS = {
    "none": "{agg}(A[i, j])",
    "mul": "{agg}(A[i, j] * B[j])",
    "add": "{agg}(A[i, j] + B[j])",
    "eq": "{agg}(A[i, j] == B[j])",
    "cond": "{agg}(A[i, j] == B[j] ? C[i, j])",
}
DTYPES = [np.float32, np.int32, np.int8, np.uint8, np.int64]


@pytest.mark.parametrize("comb", list(COMBS))
@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_and_combination(agg, comb):
    dtype = DTYPES[(AGGS.index(agg) + list(COMBS).index(comb)) % len(DTYPES)]
    out = "O[i, j : N, M]" if agg == "=" else "O[i : N]"  # `=` must not write an element twice
    src = f"function (A[N, M], B[M], C[N, M]) -> (O) {{ {out} = {COMBS[comb].format(agg=agg)}; }}"
    ins = {
        "A": ints(RNG, (3, 4), 0, 3, dtype),
        "B": ints(RNG, 4, 0, 3, dtype),
        "C": ints(RNG, (3, 4), 0, 3, dtype),
    }
    ins["A"][0, :2] = ins["B"][:2]  # some equal pairs for == and ?
    check(src, ins)


# ---------------------------------------------------------- convolutions and pooling
@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_conv_with_padding(dtype):
    ins = {"I": ints(RNG, (2, 5, 4, 3), dtype=dtype), "K": ints(RNG, (3, 3, 3, 2), dtype=dtype)}
    got = check(CONV_PAD, ins)
    np.testing.assert_array_equal(got["O"], conv_same(ins["I"], ins["K"]).astype(dtype))


def test_strided_dilated_conv():
    ins = {"I": ints(RNG, (2, 9, 10, 3)), "K": ints(RNG, (2, 2, 3, 4))}
    got = check(CONV_STRIDED, ins)
    want = np.einsum("nyxjic,jicd->nyxd", _strided_windows(ins["I"]), ins["K"].astype(np.float64))
    np.testing.assert_array_equal(got["O"], want.astype(np.float32))


def test_autodiff_seed_gradient():
    do, k = ints(RNG, SEED_SHAPES["DO"]), ints(RNG, SEED_SHAPES["K"])
    got = check(SEED, {"DO": do, "K": k})  # the post's transposed convolution, defracted
    np.testing.assert_array_equal(got["DI"], seed_expected(do, k).astype(np.float32))


def test_gradient_program_of_a_padded_conv():
    ins = {"I": ints(RNG, (1, 4, 4, 2)), "K": ints(RNG, (3, 3, 2, 2))}
    g = gradient(
        CONV_PAD, dtypes={n: DType.FLOAT32 for n in ins}, shapes={n: a.shape for n, a in ins.items()}
    )
    feed = {**ins, **{c: np.ones((1, 4, 4, 2), np.float32) for c in g.cotangents.values()}}
    got = check(g.program, feed)
    # d(sum O)/dK[kx, ky, ci, co] = sum of the padded input window: the same for every co
    dk = got[g.gradients["K"]]
    np.testing.assert_array_equal(dk[..., 0], dk[..., 1])


def test_max_pool_of_negative_values():
    src = """function (I[N, X, Y, C]) -> (O) {
        O[n, x, y, c : N, (X + 1) / 2, (Y + 1) / 2, C] = >(I[n, 2*x + i, 2*y + j, c]), i < 2, j < 2;
    }"""
    i = ints(RNG, (1, 5, 6, 2), -9, -1)
    got = check(src, {"I": i})
    p = np.pad(i, ((0, 0), (0, 1), (0, 0), (0, 0)), constant_values=-np.inf)
    np.testing.assert_array_equal(got["O"], p.reshape(1, 3, 2, 3, 2, 2).max(axis=(2, 4)))


def test_default_tensors_fill_unwritten_elements():
    stmts = " ".join(f"O{k}[2*i : M] = {agg}(A[i]) default D;" for k, agg in enumerate(AGGS))
    src = f"function (A[N], D[M]) -> ({', '.join(f'O{k}' for k in range(len(AGGS)))}) {{ {stmts} }}"
    a, d = ints(RNG, 3, 1, 5), ints(RNG, 7, 10, 20)
    got = check(src, {"A": a, "D": d})
    for k in range(len(AGGS)):
        want = d.copy()
        want[0:6:2] = a
        np.testing.assert_array_equal(got[f"O{k}"], want)


# --------------------------------------------------------------- special operations
def test_gather_scatter_reshape_shape_index():
    src = """function (D, I, V, J, L, A[N, M]) -> (G, S, R, H, X) {
        G = gather(D, I) + 1; S = scatter(V, J, L); R = reshape(A, M, N) * 2; H = shape(A);
        X = index(A, 1) + 10 * index(A, 0);
    }"""
    ins = {
        "D": ints(RNG, (4, 3), dtype=np.float64),
        "I": np.array([[0, 5], [-2, 3]], dtype=np.int8),
        "V": ints(RNG, (5, 2)),
        "J": np.array([0, 9, 2, 0, 1], dtype=np.uint8),
        "L": ints(RNG, 4),
        "A": ints(RNG, (2, 6), dtype=np.int16),
    }
    got = check(src, ins)
    np.testing.assert_array_equal(got["G"], ins["D"][np.clip(ins["I"], 0, 3)] + 1)
    want = np.zeros((4, 2), np.float32)
    np.add.at(want, np.clip(ins["J"], 0, 3), ins["V"])
    np.testing.assert_array_equal(got["S"], want)
    np.testing.assert_array_equal(got["R"], ins["A"].reshape(6, 2) * 2)
    np.testing.assert_array_equal(got["H"], np.array([2, 6], np.int32))
    np.testing.assert_array_equal(got["X"], np.add.outer(10 * np.arange(2), np.arange(6)).astype(np.int32))


def test_softmax():
    src = "function (X[R, C]) -> (S, L) { S = builtin_softmax(X, R, C); L = builtin_logsoftmax(X, R, C); }"
    flat = {"X": np.repeat(ints(RNG, (3, 1)), 4, axis=1)}
    np.testing.assert_array_equal(check(src, flat)["S"], np.full((3, 4), 0.25, np.float32))
    x = ints(RNG, (4, 9), -5, 6)
    x[1, 2] = 1000  # overflows without the max shift
    got = run(src, {"X": x})
    assert_same(got, ref_interp.run(src, {"X": x}), ulps=8 * x.shape[1])  # exp's ulps, summed in order
    assert np.allclose(got["S"].astype(np.float64).sum(axis=1), 1, atol=1e-5)


# ---------------------------------------------------- broadcasting, 0-D and empty tensors
def test_broadcasting():
    src = "function (A, B, C) -> (O) { O = A * B - C; }"
    ins = {
        "A": ints(RNG, (3, 1), dtype=np.int8),
        "B": ints(RNG, 4, 0, 5, np.uint16),
        "C": ints(RNG, (), dtype=np.float64),
    }
    got = check(src, ins)
    want = (ins["A"].astype(np.uint16) * ins["B"]).astype(np.float64) - ins["C"]  # int8 * uint16 is uint16
    np.testing.assert_array_equal(got["O"], want)


def test_zero_dimensional_and_zero_size_tensors():
    src = """function (A[], B[N], E[K, M], F[M]) -> (O, P, Q, R, S, T) {
        O = A * 2 + 1; P[] = +(B[i]); Q[] = >(B[i] * A[]);
        R[k : K] = +(E[k, m]); S[m : M] = >(E[k, m] * F[m]); T = E + 1;
    }"""
    ins = {"A": np.array(3, np.int64), "B": ints(RNG, 5, dtype=np.int64), "E": np.zeros((0, 3), np.float32)}
    ins["F"] = ints(RNG, 3)
    got = check(src, ins)
    assert got["O"] == 7 and got["P"] == ins["B"].sum() and got["Q"] == (3 * ins["B"]).max()
    assert got["R"].shape == (0,) and got["T"].shape == (0, 3)
    np.testing.assert_array_equal(got["S"], np.zeros(3, np.float32))


def test_small_and_wide_integer_types_and_bool():
    src = """function (A, B, C, D, E) -> (O1, O2, O3, O4, O5, O6) {
        O1 = A * A + B; O2 = B / (A - 1); O3 = C * 1000000007 - D; O4 = E ? D : C;
        O5[i : 4] = +(E[i, j]); O6 = (D < 0.5) | E;
    }"""
    ins = {
        "A": np.array([-128, -1, 0, 1, 127, 100], np.int8),
        "B": np.array([0, 255, 7, 200, 1, 3], np.uint8),
        "C": np.array([2**62, -(2**63), 5, -7, 123456789012, 3], np.int64),
        "D": np.array([0.5, -1.25, 1e300, np.inf, -0.0, 2.0]),
        "E": RNG.integers(0, 2, (4, 6)).astype(bool),
    }
    got = check(src, ins)
    np.testing.assert_array_equal(got["O5"], ins["E"].sum(axis=1).astype(np.int32))  # bool + is int32


def test_float_literal_comparison_keeps_tiles_typing():
    # X == 0.1 compares in promote(float32, float32): the literal becomes float32(0.1) first
    x = np.array([0.1, 0.2, np.nextafter(np.float32(0.1), np.float32(1))], np.float32)
    got = check("function (X) -> (O, P) { O = X == 0.1; P = X <= 0.1; }", {"X": x})
    np.testing.assert_array_equal(got["O"], [True, False, False])


def test_float_sums_keep_the_interpreters_order():
    a, b = RNG.standard_normal((33, 70)).astype(np.float32), RNG.standard_normal((70, 19)).astype(np.float32)
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"
    got = run(src, {"A": a, "B": b}, settings={"strict": True})  # semantics §8.3: no fma, same order
    assert_same(got, run_stripe(lowered(src, {"A": a, "B": b}), {"A": a, "B": b}))  # bit for bit


def test_work_items_are_the_owned_indexes():
    src = """function (A[M, K], B[K, N], V[T]) -> (C, S, W) {
        C[i, j : M, N] = +(A[i, k] * B[k, j]); S[j : N] = +(B[k, j]); W[] = +(V[i]);
    }"""
    ins = {"A": ints(RNG, (3, 5)), "B": ints(RNG, (5, 4)), "V": ints(RNG, 6)}
    cp = build(src, ins, {"tiled": False})  # the general kernels (test_opencl_tiled: the matmul's tiles)
    extra = cp.library.extra
    plans = zip(cp.infos, extra["owned"], extra["work_items"])
    got = [(owned, work) for info, owned, work in plans if "contraction" in info.block.tags]
    # a reduction index is never owned; a full reduction owns nothing and runs as one work-item
    assert got == [(("i", "j"), 12), (("j",), 4), ((), 1)]


# ----------------------------------------------------------------- build and cache
def test_second_build_hits_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    src, ins = "function (A[N], B[N]) -> (O) { O = exp(A) * B; }", {"A": ints(RNG, 100), "B": ints(RNG, 100)}
    first = build(src, ins)
    first.library.handle.program()
    assert first.library.extra["cache"] == "miss" and len(list(tmp_path.glob("*.clbin"))) == 1
    second = build(src, ins)
    second.library.handle.program()
    assert second.library.extra["cache"] == "hit"
    assert second.library.extra["cache_key"] == first.library.extra["cache_key"]
    assert_same(second(ins), first(ins))
    other = build(src, ins, {"fast_math": True})  # settings are part of the key
    other.library.handle.program()
    assert other.library.extra["cache"] == "miss" and len(list(tmp_path.glob("*.clbin"))) == 2
    off = build(src, ins, {"cache": False})
    off.library.handle.program()
    assert off.library.extra["cache"] == "off" and len(list(tmp_path.glob("*.clbin"))) == 2


def test_build_is_asynchronous_unless_asked():
    src, ins = "function (A[N]) -> (O) { O = sqrt(A); }", {"A": ints(RNG, 10, 0, 9)}
    lazy = build(src, ins, {"cache": False})
    assert lazy.library.handle.future is not None  # compiling on the build pool
    eager = build(src, ins, {"cache": False, "async": False})
    assert eager.library.handle.future is None and eager.library.extra["cache"] == "off"
    assert_same(lazy(ins), eager(ins))


def test_fast_math_uses_mad_and_native_functions():
    src = "function (A[M, K], B[K, N]) -> (C, E) { C[i, j : M, N] = +(A[i, k] * B[k, j]); E = exp(A); }"
    ins = {"A": ints(RNG, (4, 5)), "B": ints(RNG, (5, 3))}
    cp = build(src, ins, {"fast_math": True, "tiled": False})  # the general kernel's mad
    assert "mad(" in cp.library.source and "native_exp(" in cp.library.source
    np.testing.assert_array_equal(cp(ins)["C"], ins["A"].astype(np.float64) @ ins["B"])  # exact on integers
    assert "mad(" not in build(src, ins, {"tiled": False}).library.source


def test_float16_on_a_device_without_it_is_a_clear_error():
    dev = OpenCLDevice(device().cl_device, "opencl_test.0", fp16=False)
    with pytest.raises(DeviceTypeError, match=r"needs float16, which device opencl_test\.0") as e:
        build("function (A) -> (O) { O = as_float(A, 16); }", {"A": ints(RNG, 3)}, dev=dev)
    assert isinstance(e.value, TileTypeError) and "cl_khr_fp16" in str(e.value) and e.value.hint


def test_float64_on_a_device_without_it_is_refused_but_float_literals_need_none():
    dev = OpenCLDevice(device().cl_device, "opencl_test.0", fp64=False)
    assert not dev.capabilities.supports(DType.FLOAT64)
    with pytest.raises(DeviceTypeError, match="needs float64"):
        build("function (A) -> (O) { O = A + 1; }", {"A": ints(RNG, 3, dtype=np.float64)}, dev=dev)
    src = "function (X) -> (O, P) { O = (X < 0.3) + (0.3 > X) + (X >= 0.3); P = X * 0.1 + as_int(X, 64); }"
    x = np.float32([0.25, 0.3, 0.5, np.nextafter(np.float32(0.3), 0), np.nan, -np.inf])
    cp = build(src, {"X": x}, dev=dev)
    assert "double" not in cp.library.source
    assert_same(cp({"X": x}), run_stripe(cp.program, {"X": x}))


# ------------------------------------------------------------------- the HAL itself
def test_buffers_runs_copies_and_events():
    cp = build("function (A[N]) -> (O) { O = A * 3; }", {"A": ints(RNG, 1000)})
    (info,), (kernel,) = cp.infos, cp.kernels
    ex = device().executor
    a, o, dst = ex.allocate(4000), ex.allocate(4000), ex.allocate(4000)
    junk = o.map_discard()
    junk[:] = 7
    o.unmap(junk)
    assert (o.map_current() == 7).all()
    o.unmap(o.map_discard())  # all zeros: a fill on the device
    assert not o.map_current().any()
    view = a.map_discard()
    view[:] = np.arange(1000, dtype=np.float32).view(np.uint8)
    up = a.unmap(view)
    bufs = {"A": a, "O": o}
    with ex.profiled():  # (events report their duration only when profiled)
        done = kernel.run([bufs[n] for n in info.buffers], [up, Event.done()])
        copied = ex.copy(o, 400, dst, 0, 3600, [done])
    assert isinstance(done, CLEvent) and isinstance(copied, CLEvent)
    assert done.duration > 0 and copied.duration > 0 and done.complete and copied.complete
    np.testing.assert_array_equal(dst.map_current([copied]).view(np.float32)[:900], np.arange(100, 1000) * 3)
    with pytest.raises(ValueError, match="takes 2 buffers"):
        kernel.run([a])
    with pytest.raises(ValueError, match="distinct"):
        kernel.run([a, a])
    with pytest.raises(TypeError, match="CLBuffers"):
        kernel.run([a, object()])
    empty = ex.allocate(0)
    assert isinstance(empty, CLBuffer) and empty.map_current().size == 0


# ------------------------------------------------------------- the shared C emission
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_clike_emission_is_plain_c_too(tmp_path):
    """The same kernels through ``CTarget`` (plain C99): compiled by the host C compiler and run."""
    src = """function (I[N, X, C], K[KX, C, D], M) -> (O, P, Q) {
        O[n, x, d : N, X, D] = +(I[n, x + k - 1, c] * K[k, c, d]);
        P = as_int(O, 8) / 3 + (M >> 1); Q[d : D] = >(O[n, x, d]);
    }"""
    ins = {"I": ints(RNG, (2, 5, 3)), "K": ints(RNG, (3, 3, 4)), "M": ints(RNG, 4, 0, 9, np.int16)}
    program = lowered(src, ins)
    roots = frozenset(r.into for r in program.refs)
    infos = [KernelInfo(k.name, k, buffer_names(k, roots)) for k in program.stmts[0].stmts]
    t = CTarget()
    kernels = generate(t, infos, {r.into: r.shape.dtype.value for r in program.refs})
    text = "\n\n".join(["\n".join(t.header()), *helper_source(t), *(k.text for k in kernels)])
    (tmp_path / "k.c").write_text(text)
    lib = tmp_path / "k.so"
    subprocess.run(
        ["cc", "-std=c99", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "k.c"), "-lm"],
        check=True,
    )
    so = ctypes.CDLL(str(lib))
    arrays = {r.into: np.zeros(r.shape.sizes, r.shape.dtype.numpy) for r in program.refs}
    for name, value in ins.items():
        arrays[name][...] = value
    for info, k in zip(infos, kernels):
        ptrs = (ctypes.c_void_p * len(info.buffers))(*(arrays[b].ctypes.data for b in info.buffers))
        getattr(so, k.name)(ptrs, ctypes.c_int64(0), ctypes.c_int64(k.work_items))
    assert_same({n: arrays[n] for n in ("O", "P", "Q")}, ref_interp.run(src, ins))
    assert re.search(r"void tile_k\d+_\w+\(void \*\*bufs", text) and "__kernel" not in text
