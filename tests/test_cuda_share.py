"""CUDA memory shared with OpenCL (``backends.cuda.share``) and ``tile.torch``'s CUDA tensors
on it (``tile.torch_cuda``).

Without a GPU: why sharing is refused (a device without the extensions, no OpenCL device,
``TILE_CUDA_SHARING=0``; the CUDA calls, through the bindings: tests/test_cuda_bindings_paths.py).
With CUDA and NVIDIA's OpenCL (an H100): values equal torch's on integer data, the path said under
``TILE_DEBUG=1``, gradients in float64, non-contiguous and bfloat16 tensors, blocks reused, and
``torch.compile``. There, a driver that lists the extensions but cannot share fails the tests.
"""

from __future__ import annotations

import gc

import pytest

from backends import registry
from backends.cuda import share as cuda_share
from backends.cuda.share import Sharing

try:
    import torch
except ImportError:  # the GPU tests skip below
    torch = None

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
ADD = "function (A[N], B[N]) -> (C) { C = A + B; }"


def test_sharing_needs_an_opencl_device(monkeypatch):
    monkeypatch.delenv("TILE_CUDA_SHARING", raising=False)
    assert Sharing.for_device(registry.get("llvm_cpu.0")) == (None, "llvm_cpu.0 is not an OpenCL device")


def test_sharing_refuses_a_device_without_the_extensions(monkeypatch):
    monkeypatch.delenv("TILE_CUDA_SHARING", raising=False)
    if "opencl_cpu.0" not in registry.devices():
        pytest.skip("no opencl_cpu.0 (PoCL) device")
    found, why = Sharing.for_device(registry.get("opencl_cpu.0"))
    assert found is None and "opencl_cpu.0's OpenCL driver lacks" in why
    assert "cl_khr_external_memory_opaque_fd" in why


def test_sharing_is_off_with_tile_cuda_sharing_0(monkeypatch):
    monkeypatch.setenv("TILE_CUDA_SHARING", "0")
    assert Sharing.for_device(registry.get("llvm_cpu.0")) == (None, "TILE_CUDA_SHARING=0 turns it off")


# -- CUDA tensors on opencl_gpu.0 (an H100 with NVIDIA's OpenCL) ------------------------------------


def _gpu_why_not() -> str:
    if torch is None or not torch.cuda.is_available():
        return "no CUDA device (or no torch)"
    if "opencl_gpu.0" not in registry.devices():
        return "no opencl_gpu.0"
    dev = registry.get("opencl_gpu.0")
    if "NVIDIA" not in dev.identity["platform"]:
        return f"opencl_gpu.0 is {dev.identity['platform']}'s, not NVIDIA's"
    missing = [e for e in cuda_share.EXTENSIONS if e not in dev.extensions]
    return f"opencl_gpu.0 lacks {', '.join(missing)}" if missing else ""


@pytest.fixture
def sharing():
    why = _gpu_why_not()
    if why:
        pytest.skip(f"runs only on a machine with CUDA and NVIDIA's OpenCL: {why}")
    found, why = Sharing.for_device(registry.get("opencl_gpu.0"))
    assert found is not None, f"opencl_gpu.0 lists the extensions, but sharing fails: {why}"
    return found


def ints(*shape, dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype or torch.float32).cuda()


def test_cuda_tensors_share_memory_with_opencl(sharing, monkeypatch, capfd):
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cs_matmul", device="opencl_gpu.0")
    monkeypatch.setenv("TILE_DEBUG", "1")
    a, b = ints(5, 7), ints(7, 3, seed=1)
    out = mm(a, b)
    assert out.device == a.device and torch.equal(out, a @ b)
    err = capfd.readouterr().err
    path = "CUDA memory shared with OpenCL (cl_khr_external_memory_opaque_fd)"
    assert f"cs_matmul on opencl_gpu.0: {path}: 224 bytes copied device-to-device" in err
    assert "host copies" not in err


def test_cuda_gradcheck_float64_on_shared_memory(sharing, monkeypatch, capfd):
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cs_matmul", device="opencl_gpu.0")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, generator=g, dtype=torch.float64).cuda().requires_grad_()
    b = torch.randn(3, 4, generator=g, dtype=torch.float64).cuda().requires_grad_()
    assert torch.autograd.gradcheck(mm, (a, b))
    monkeypatch.setenv("TILE_DEBUG", "1")
    mm(a, b).sum().backward()
    assert "cs_matmul on opencl_gpu.0: CUDA memory shared" in capfd.readouterr().err  # the backward too
    assert torch.allclose(a.grad, torch.ones(2, 4, dtype=torch.float64, device="cuda") @ b.T)


def test_cuda_non_contiguous_input(sharing):
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cs_matmul", device="opencl_gpu.0")
    a, bt = ints(6, 5)[1:4], ints(3, 5, seed=1).T  # an offset view, a transpose
    assert torch.equal(mm(a, bt), a @ bt)


def test_cuda_bfloat16_in_and_out(sharing):
    import tile.torch as tt

    add = tt.op(ADD, name="cs_add", device="opencl_gpu.0")
    mm = tt.op(MATMUL, name="cs_matmul", device="opencl_gpu.0")
    a, b = ints(9, dtype=torch.bfloat16), ints(9, dtype=torch.bfloat16, seed=1)
    out = add(a, b)
    assert out.dtype == torch.bfloat16 and torch.equal(out, a + b)
    x, y = ints(3, 4, dtype=torch.bfloat16), ints(4, 2, dtype=torch.bfloat16, seed=1)
    assert torch.equal(mm(x, y), x @ y)  # small integers: exact in bfloat16


def test_cuda_outputs_return_blocks_to_the_pool(sharing):
    import tile.torch as tt

    add = tt.op(ADD, name="cs_add", device="opencl_gpu.0")
    a, b = ints(1000), ints(1000, seed=1)
    out = add(a, b)
    out = add(a, b)  # the first result freed when this one replaced it
    gc.collect()
    blocks = sharing.blocks
    for _ in range(50):
        out = add(a, b)
    assert torch.equal(out, a + b)
    assert sharing.blocks == blocks, "blocks were not reused"


def test_cuda_torch_compile_fullgraph(sharing):
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cs_matmul", device="opencl_gpu.0")
    a, b = ints(4, 3), ints(3, 5, seed=1)
    compiled = torch.compile(lambda a, b: torch.relu(mm(a, b)) * 2, fullgraph=True)
    assert torch.equal(compiled(a, b), torch.relu(a @ b) * 2)
    a64, b64 = a.double().requires_grad_(), b.double()
    f = torch.compile(lambda a, b: mm(a, b).sum(), fullgraph=True, backend="aot_eager")
    f(a64, b64).backward()
    assert torch.equal(a64.grad, torch.ones(4, 5, dtype=torch.float64, device="cuda") @ b64.T)


def test_cuda_host_fallback_when_sharing_is_off(sharing, monkeypatch, capfd):
    import tile.torch as tt

    mm = tt.op(MATMUL, name="cs_matmul", device="opencl_gpu.0")
    monkeypatch.setenv("TILE_DEBUG", "1")
    monkeypatch.setenv("TILE_CUDA_SHARING", "0")
    a, b = ints(2, 3), ints(3, 4, seed=1)
    assert torch.equal(mm(a, b), a @ b)
    err = capfd.readouterr().err
    assert "on opencl_gpu.0: host copies (cuda -> host -> opencl_gpu.0 -> host -> cuda)" in err
    assert "CUDA memory not shared with OpenCL: TILE_CUDA_SHARING=0 turns it off" in err
