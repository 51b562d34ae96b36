"""The device ``cuda.N`` (``backends.cuda.device``): CUDA source from the shared generator, NVRTC,
launches on the caller's stream, torch's memory used in place, CUDA graphs.

Without a GPU: the OpenCL-to-CUDA rewrites, and (where the CUDA toolkit's ``nvcc`` is installed)
that the generated source of a corpus compiles, tensor-core kernels included, for a stand-in
sm_90 device. With a GPU (the device machine): values equal the interpreter's on integer-valued
data across dtypes, ``tile.tensor`` wraps torch tensors and DLPack producers without a copy,
``tile.torch`` runs on ``cuda.0`` in place on the current stream, and a call is captured in a
``torch.cuda.graph`` and replayed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tile
from backends import driver, registry
from backends.cuda import nvrtc
from backends.cuda.compiler import CudaCompiler
from backends.cuda.device import CudaDevice
from backends.cuda.dialect import translate
from backends.hal import Capabilities
from tile.dtypes import DType
from tile.parser import parse

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
ADD = "function (A[N], B[N]) -> (C) { C = A + B; }"


# ---------------------------------------------------------------------------------- no GPU
def test_local_pointers_become_generic_and_arrays_shared():
    src = "__local float As4[64];\n__local float* As = (__local float*)As4;\nx = *(__local const uint*)(a);"
    out = translate(src)
    assert "__shared__ float As4[64];" in out
    assert "float* As = (float*)As4;" in out
    assert "*(const uint*)(a)" in out and "__local" not in out


def test_shared_addresses_for_inline_ptx_use_the_shared_window():
    out = translate('const uint s = (uint)(ulong)As4;\nasm("" :: "r"((uint)(ulong)(As + 4 * k)));')
    assert "(uint)__cvta_generic_to_shared(As4)" in out
    assert "(uint)__cvta_generic_to_shared(As + 4 * k)" in out


def test_kernel_qualifiers_vectors_and_group_sizes():
    out = translate("__kernel __attribute__((reqd_work_group_size(256, 1, 1)))\n"
                    "void k(__global float* restrict a)\n{ *p = (uint4)(x, y, z, w); }")
    assert out.startswith('extern "C" __global__ __launch_bounds__(256)')
    assert "tile_make_uint4(x, y, z, w)" in out


class _Facts:
    """A stand-in H100's facts (what ``runtime.Cuda`` reads from the driver)."""

    capability = (9, 0)
    shared_bytes = 48 * 1024
    optin_bytes = 227 * 1024
    sms = 132
    max_threads = 1024
    clock_mhz = 1980.0
    total_bytes = 80 << 30
    name = "stand-in sm_90"
    driver_version = 13000


def _stand_in() -> CudaDevice:
    dev = CudaDevice.__new__(CudaDevice)
    dev.cuda = _Facts()
    dev.id = "cuda.stand-in"
    dev.description = "a stand-in sm_90 device (no GPU)"
    dev.capabilities = Capabilities(frozenset(DType), fp64=True, fp16=True, atomics=True)
    dev.compiler = CudaCompiler(dev.cuda)
    dev.executor = None
    return dev


CORPUS = [
    (MATMUL, {"A": (512, 512), "B": (512, 512)}, "float16", "mma"),
    (MATMUL, {"A": (256, 259), "B": (259, 256)}, "float16", "mma"),
    (MATMUL, {"A": (256, 259), "B": (259, 256)}, "bfloat16", "mma"),  # tensor cores (warp-group on sm_90)
    (MATMUL, {"A": (100, 37), "B": (37, 51)}, "float32", ""),  # tiled, edges
    (MATMUL, {"A": (64, 96), "B": (96, 80)}, "bfloat16", "mma"),
    ("function (A[N, M]) -> (B) { R[n, 0: N, 1] = >(A[n, m]); E = exp(A - R); S[n, 0: N, 1] = +(E[n, m]); "
     "B = E / S; }", {"A": (64, 1000)}, "float32", ""),
    ("function (A[N], B[N]) -> (C) { C = A < B ? A / B : tanh(A) + sqrt(B) + sigmoid(A) + round(A); }",
     {"A": (1000,), "B": (1000,)}, "float16", ""),
    ("function (A[N], B[N]) -> (C) { C = A / B + mod(A, B) + max(A, B) + as_int(as_float(B, 16), 8); }",
     {"A": (1000,), "B": (1000,)}, "int64", ""),
    ("function (A[N, M]) -> (S) { S[] = +(A[n, m]); }", {"A": (1000, 1000)}, "float64", ""),
]


@pytest.mark.skipif(nvrtc.compiler() is None, reason="no CUDA compiler here (neither NVRTC nor nvcc)")
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("case", range(len(CORPUS)))
def test_generated_cuda_compiles_to_ptx(case, strict):
    src, shapes, dt, instr = CORPUS[case]
    npdt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.dtype(dt)
    bound = driver.bind_inputs(parse(src), {k: np.ones(v, dtype=npdt) for k, v in shapes.items()})
    build = driver.build(bound, _stand_in(), {"strict": strict, "cache": False})
    ptx = build.library.handle
    assert b".entry tile_k0" in ptx
    if instr and not strict:
        assert b"mma" in ptx, "the tensor-core kernel was not generated"


def test_without_a_driver_the_listing_says_why():
    from backends.cuda.device import devices
    from backends.cuda.runtime import unavailable

    if unavailable() is None:
        pytest.skip("this machine has a CUDA driver")
    found = devices()
    assert list(found) == [] and "cuda" in found.unavailable


# ---------------------------------------------------------------------------------- GPU
def _gpu():
    if "cuda.0" not in registry.devices():
        pytest.skip("no cuda.0 here (needs an NVIDIA GPU, its driver, cuda-bindings and NVRTC)")
    return registry.get("cuda.0")


def _torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


VALUE_CASES = [
    (ADD, "int32"), (ADD, "int8"), (ADD, "uint64"), (ADD, "float16"), (ADD, "bfloat16"), (ADD, "float64"),
    (MATMUL, "float32"), (MATMUL, "float16"), (MATMUL, "bfloat16"), (MATMUL, "int32"),
    ("function (A[N, M]) -> (S) { S[n: N] = >(A[n, m]); }", "float32"),
    ("function (A[N, M]) -> (B) { B[m, n: M, N] = =(A[n, m]); }", "int16"),
]


@pytest.mark.parametrize("src,dt", VALUE_CASES)
@pytest.mark.parametrize("size", [1, 67, 256])
def test_values_equal_the_interpreter_on_integer_data(src, dt, size):
    _gpu()
    rng = np.random.default_rng(size)
    npdt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.dtype(dt)
    if src == ADD:
        arrays = {"A": rng.integers(-8, 8, size), "B": rng.integers(0, 8, size)}
    elif src == MATMUL:
        arrays = {"A": rng.integers(-3, 4, (size, size + 3)), "B": rng.integers(-3, 4, (size + 3, size))}
    else:
        arrays = {"A": rng.integers(-50, 50, (size, size + 1))}
    arrays = {k: v.astype(npdt) for k, v in arrays.items()}
    want = tile.compile(src, device="interp")(**arrays)
    got = tile.compile(src, device="cuda.0")(**arrays)
    for k in want:
        wide = np.asarray(want[k]).astype(np.float64)
        np.testing.assert_array_equal(np.asarray(got[k]).astype(np.float64), wide)


def test_tile_tensor_wraps_torch_memory_without_a_copy():
    _gpu()
    torch = _torch()
    a = torch.arange(10, dtype=torch.float32, device="cuda")
    b = torch.ones(10, dtype=torch.float32, device="cuda")
    ta, tb = tile.tensor(a, device="cuda.0"), tile.tensor(b, device="cuda.0")
    assert ta._buffer.pointer == a.data_ptr() and ta.shape == (10,)
    f = tile.compile(ADD, device="cuda.0")
    a.mul_(2)  # changed in place after wrapping: the program reads the new values
    out = f(A=ta, B=tb, resident=True)["C"]
    np.testing.assert_array_equal(out.numpy(), np.arange(10) * 2 + 1)


def test_tile_tensor_takes_a_dlpack_producer():
    _gpu()
    torch = _torch()

    class OnlyDLPack:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    x = torch.arange(12, dtype=torch.bfloat16, device="cuda").reshape(3, 4)
    t = tile.tensor(OnlyDLPack(x), device="cuda.0")
    assert t._buffer.pointer == x.data_ptr() and t.shape == (3, 4) and t.tile_dtype is DType.BFLOAT16
    np.testing.assert_array_equal(t.numpy().astype(np.float32), np.arange(12).reshape(3, 4))


def test_a_non_contiguous_tensor_is_refused_with_a_fix():
    _gpu()
    torch = _torch()
    x = torch.zeros(4, 6, device="cuda").t()
    with pytest.raises(tile.TileError, match="contiguous"):
        tile.tensor(x, device="cuda.0")


def test_tile_torch_runs_on_cuda0_in_place_on_the_current_stream(capsys, monkeypatch):
    _gpu()
    torch = _torch()
    import tile.torch as tt

    monkeypatch.setenv("TILE_DEBUG", "1")
    op = tt.op(MATMUL, name="cuda_device_mm")
    s = torch.cuda.Stream()
    a = torch.randint(-3, 4, (64, 48), device="cuda").float()
    b = torch.randint(-3, 4, (48, 32), device="cuda").float()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c = op(a, b)
        want = a @ b
    s.synchronize()
    assert torch.equal(c, want)
    assert "on cuda.0" in capsys.readouterr().err


def test_a_call_is_captured_in_a_cuda_graph_and_replayed():
    _gpu()
    torch = _torch()
    import tile.torch as tt

    op = tt.op(ADD, name="cuda_device_graph_add")
    x = torch.zeros(1000, device="cuda")
    y = torch.ones(1000, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up: compiled and loaded outside the capture
            op(x, y)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(x, y)
    x.copy_(torch.arange(1000, device="cuda", dtype=torch.float32))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.arange(1000, device="cuda", dtype=torch.float32) + 1)


def _general_refused(monkeypatch, torch, owner, name: str):
    """A side stream that waits for the current one, with ``owner.name`` (the general path) made
    to fail."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(owner, name, refuse)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    return s


def test_repeat_calls_on_cuda0_take_the_lane_on_the_current_stream(monkeypatch):
    """After a signature's first call, calls pass the tensors' pointers straight to cuLaunchKernel
    (``tile.torch_lane``): the general path made to fail, forward and backward stay exact, on a
    side stream whose own work wrote the inputs just before."""
    _gpu()
    torch = _torch()
    import tile.torch as tt
    from backends.runner import CompiledProgram
    from tile.torch_lane import TorchLane, signature

    mm = tt.op(MATMUL, name="cuda_device_lane_mm")

    def ints(*shape):
        return torch.randint(-3, 4, shape, device="cuda").float()

    a, b, g = ints(33, 17).requires_grad_(), ints(17, 9).requires_grad_(), ints(33, 9)
    mm(a, b).backward(g)  # the general path, both ways
    assert isinstance(mm._lanes[signature((a, b))], TorchLane)
    assert any(isinstance(v, TorchLane) for v in mm._grad_lanes.values())

    s = _general_refused(monkeypatch, torch, CompiledProgram, "run")
    with torch.cuda.stream(s):
        for _ in range(3):
            a, b = ints(33, 17).requires_grad_(), ints(17, 9).requires_grad_()
            c = mm(a, b)
            c.backward(g)
            want = a.detach() @ b.detach()
            ga, gb = g @ b.detach().t(), a.detach().t() @ g
            s.synchronize()
            assert torch.equal(c, want) and torch.equal(a.grad, ga) and torch.equal(b.grad, gb)


def test_calls_on_cuda0_take_the_hot_call_and_leave_it_for_anything_else(monkeypatch):
    """After a signature's lane is kept, a CUDA call without a gradient is the hot call
    (``tile.torch_hot.HotCall``, its device checked as the CPU's is): the op's own path made to
    fail, calls on a side stream stay exact; a call of another shape, a CPU tensor, one needing a
    gradient, or the same tensor twice leaves it for the general path, which gives the same."""
    _gpu()
    torch = _torch()
    import tile.torch as tt
    from tile.torch import TorchOp

    add = tt.op(ADD, name="cuda_device_hot_add")
    x, y = torch.arange(7.0, device="cuda"), torch.full((7,), 2.0, device="cuda")
    add(x, y)
    add(x, y)
    hot = add._hot
    assert hot is not None, "no hot call kept for a CUDA signature"
    general = TorchOp._forward_at

    s = _general_refused(monkeypatch, torch, TorchOp, "_forward_at")
    with torch.cuda.stream(s):
        for k in range(3):
            a = torch.full((7,), float(k), device="cuda")  # written on s just before
            got = add(a, y)
            s.synchronize()
            assert torch.equal(got, a + y)
    monkeypatch.setattr(TorchOp, "_forward_at", general)
    assert add._hot is hot
    others = [(torch.arange(5.0, device="cuda"), torch.ones(5, device="cuda")),  # another shape
              (torch.arange(7.0), torch.ones(7)),  # the CPU
              (torch.arange(7.0, device="cuda").requires_grad_(), y),  # a gradient wanted
              (y, y)]  # one tensor twice
    for a, b in others:
        assert torch.equal(add(a, b).detach().cpu(), (a + b).detach().cpu())
    a = torch.arange(7.0, device="cuda").requires_grad_()
    add(a, y).sum().backward()
    assert torch.equal(a.grad, torch.ones(7, device="cuda"))


def test_tile_torch_on_cuda0_gradients_non_contiguous_and_bfloat16():
    _gpu()
    torch = _torch()
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cuda_device_mm_grad")
    a = torch.randn(5, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(mm, (a, b))
    x = torch.randint(-3, 4, (6, 5), device="cuda").float().t()  # not contiguous
    y = torch.randint(-3, 4, (6, 2), device="cuda").float()
    assert torch.equal(mm(x, y), x @ y)
    xb, yb = x.contiguous().bfloat16(), y.bfloat16()
    got = mm(xb, yb)
    want = (xb.float() @ yb.float()).bfloat16()
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want.float())


def test_tile_torch_on_cuda0_under_torch_compile():
    _gpu()
    torch = _torch()
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cuda_device_mm_compiled")

    @torch.compile(fullgraph=True)
    def f(a, b):
        return mm(a, b) * 2

    a = torch.randint(-3, 4, (8, 4), device="cuda").float()
    b = torch.randint(-3, 4, (4, 3), device="cuda").float()
    assert torch.equal(f(a, b), (a @ b) * 2)


def test_foreign_memory_is_refused_with_what_to_do_without_a_gpu():
    """``backends.cuda.foreign`` reads the layout before it asks the driver anything: strides
    that are not C-contiguous, a type Tile lacks, and DLPack data outside CUDA memory are refused
    as TileInputErrors saying what to do."""
    from backends.cuda import foreign

    class Strided:
        __cuda_array_interface__ = {"shape": (4, 6), "typestr": "<f4", "strides": (4, 16),
                                    "data": (0, False), "version": 3}

    class Complex:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<c8", "strides": None,
                                    "data": (0, False), "version": 3}

    with pytest.raises(tile.TileError, match=r"not C-contiguous \(strides \(4, 16\)") as got:
        foreign.from_interface(Strided(), "x")
    assert "contiguous()" in got.value.hint
    with pytest.raises(tile.TileError, match="element type <c8, which Tile does not have"):
        foreign.from_interface(Complex(), "x")
    with pytest.raises(tile.TileError, match=r"not in CUDA memory \(DLPack device type 1\)"):
        foreign.from_dlpack(np.zeros(3, np.float32), 1, "x")
    assert foreign.view(np.zeros(3, np.float32), 1) is None  # host data: not ours to wrap
