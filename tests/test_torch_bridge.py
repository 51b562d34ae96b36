"""tile.torch: a Tile function as a PyTorch custom operator, in eager mode, under
``torch.compile(fullgraph=True)``, through ``gradcheck`` and ``opcheck``, with errors in the
user's terms. Values are compared with torch on integer-valued data (exact); gradients in float64.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tile
from backends import registry

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch (pip install -e '.[torch]')")
tt = pytest.importorskip("tile.torch", reason="tile.torch needs PyTorch")

pytestmark = pytest.mark.skipif(
    "llvm_cpu.0" not in registry.devices(), reason="tile.torch runs CPU tensors on llvm_cpu.0"
)

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
TWO = """function (X[N, C], W[C]) -> (Y, S) {
    Y = tanh(X * W);
    S[n: N] = +(X[n, c] * X[n, c]);
}"""
POOL = "function (I[N]) -> (O) { O[i: (N + 1) / 2] = >(I[2 * i + j]), j < 2; }"


def ints(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def f64(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)


def test_import_tile_does_not_import_torch_or_jax():
    code = (
        "import sys, tile; tile.compile('function (A) -> (B) { B = A; }'); "
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert tile.torch is tt  # loaded by attribute on first use
    missing = (  # without the framework: hasattr is False, the error says what to install
        "import sys; sys.modules['torch'] = None; import tile; assert not hasattr(tile, 'torch'); "
        "tile.torch"
    )
    r = subprocess.run([sys.executable, "-c", missing], capture_output=True, text=True)
    assert "AttributeError: tile.torch needs torch installed (pip install -e '.[torch]')" in r.stderr


def test_values_match_torch_exactly_on_integer_data():
    mm = tt.op(MATMUL, name="t_matmul")
    a, b = ints(3, 5), ints(5, 4, seed=1)
    assert torch.equal(mm(a, b), a @ b)
    two = tt.op(TWO, name="t_two")
    x, w = ints(4, 3), ints(3, seed=2)
    y, s = two(x, w)
    assert torch.equal(y, torch.tanh(x * w)) and torch.equal(s, (x * x).sum(1))
    pool = tt.op(POOL, name="t_pool")
    i = ints(7, dtype=torch.float64)
    want = torch.nn.functional.max_pool1d(i[None], 2, ceil_mode=True)[0]
    assert torch.equal(pool(i), want)


def test_int_and_bool_inputs_and_outputs():
    gather = tt.op("function (T[N], I[M]) -> (O, P) { O = gather(T, I); P = O > 0; }", name="t_gather")
    t, idx = ints(6), torch.tensor([5, 0, 2, 2], dtype=torch.int32)
    o, p = gather(t, idx)
    assert torch.equal(o, t[idx.long()]) and p.dtype == torch.bool and torch.equal(p, t[idx.long()] > 0)
    t64 = f64(6)
    o, p = gather(t64, idx)
    o.sum().backward()  # the int index gets no gradient, the bool output takes none
    want = torch.zeros(6, dtype=torch.float64).index_add_(0, idx, torch.ones(4, dtype=torch.float64))
    assert torch.equal(t64.grad, want)


def test_gradcheck_float64():
    mm = tt.op(MATMUL, name="t_matmul")
    assert torch.autograd.gradcheck(mm, (f64(2, 3), f64(3, 4, seed=1)))
    two = tt.op(TWO, name="t_two")
    assert torch.autograd.gradcheck(two, (f64(4, 3), f64(3, seed=3)))
    pool = tt.op(POOL, name="t_pool")
    assert torch.autograd.gradcheck(pool, (torch.arange(7.0, dtype=torch.float64).requires_grad_(),))


def test_only_the_needed_gradients_are_computed():
    mm = tt.op(MATMUL, name="t_needed")
    a, b = f64(2, 3), torch.randn(3, 4, dtype=torch.float64)
    mm(a, b).sum().backward()
    assert [wrt for (_, wrt, _) in mm.core._grads] == [(0,)]  # the gradient program for A alone
    assert torch.allclose(a.grad, torch.ones(2, 4, dtype=torch.float64) @ b.T)


def test_opcheck():
    for name, src, args in [
        ("t_matmul", MATMUL, (f64(2, 3), f64(3, 4, seed=1))),
        ("t_two", TWO, (f64(4, 3), f64(3, seed=3))),
        ("t_pool", POOL, (f64(7),)),
    ]:
        op = tt.op(src, name=name)
        result = torch.library.opcheck(op.op, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_torch_compile_fullgraph_forward_and_backward():
    mm = tt.op(MATMUL, name="t_matmul")
    pool = tt.op(POOL, name="t_pool")

    def f(a, b):
        return pool(torch.relu(mm(a, b)).reshape(-1) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a, b = f64(3, 4), f64(4, 2, seed=1)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    got, want = compiled(a, b), f(a2, b2)
    assert torch.allclose(got, want)
    got.backward()
    want.backward()
    assert torch.allclose(a.grad, a2.grad) and torch.allclose(b.grad, b2.grad)


def test_torch_compile_default_backend():
    """Inductor (the default backend) around the op: the op stays one node of the graph."""
    mm = tt.op(MATMUL, name="t_matmul")
    compiled = torch.compile(lambda a, b: torch.relu(mm(a, b)) * 2, fullgraph=True)
    a, b = ints(3, 4).requires_grad_(), ints(4, 5, seed=1)
    out = compiled(a, b)
    assert torch.equal(out, torch.relu(a.detach() @ b) * 2)
    out.sum().backward()
    assert torch.equal(a.grad, ((a.detach() @ b > 0).float() * 2) @ b.T)


def test_torch_compile_dynamic_shapes_infer_symbolic_sizes():
    """Sizes as SymInts: the fake kernel hands back symbolic output sizes (floor and ceiling
    divisions of strided windows), so three sizes share one graph."""
    from torch._dynamo.testing import CompileCounter

    pool = tt.op(POOL, name="t_pool")
    counter = CompileCounter()
    compiled = torch.compile(lambda x: pool(x) + 1, fullgraph=True, dynamic=True, backend=counter)
    for n in (5, 8, 11):
        x = ints(n)
        assert torch.equal(compiled(x), torch.nn.functional.max_pool1d(x[None], 2, ceil_mode=True)[0] + 1)
    assert counter.frame_count == 1
    ops = pytest.importorskip("tile.ops", reason="tile.ops (the op library) is not there")
    conv = tt.op(ops.conv2d(stride=2, padding=1), name="t_conv_s2")
    pool2 = tt.op(ops.max_pool2d(3, stride=2, ceil_mode=True), name="t_pool_3s2")
    counter = CompileCounter()
    compiled = torch.compile(lambda x, w: pool2(conv(x, w)), fullgraph=True, dynamic=True, backend=counter)
    w = ints(4, 3, 3, 3)
    for n in (9, 12, 15):
        x = ints(2, 3, n, n)
        want = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(x, w, stride=2, padding=1), 3,
                                              stride=2, ceil_mode=True)
        assert torch.equal(compiled(x, w), want)
    assert counter.frame_count == 1


def test_shape_mismatch_names_the_tile_input_and_the_dims():
    mm = tt.op(MATMUL, name="t_matmul")
    with pytest.raises(tile.TileInputError) as e:
        mm(torch.ones(2, 3), torch.ones(4, 5))
    text = str(e.value)
    assert "tile.torch op 't_matmul'" in text and "A float32[2, 3], B float32[4, 5]" in text
    assert "dimension 'L' is 3" in text and "'B'" in text
    with pytest.raises(tile.TileInputError, match="declared with 2 dimension"):
        mm(torch.ones(2, 3, 1), torch.ones(3, 5))
    with pytest.raises(tile.TileInputError, match=r"takes 2 tensor\(s\) \(A, B\), got 1"):
        mm(torch.ones(2, 3))
    with pytest.raises(tile.TileInputError, match="complex64"):
        mm(torch.ones(2, 3, dtype=torch.complex64), torch.ones(3, 5, dtype=torch.complex64))
    with pytest.raises(tile.TileNameError, match="expp"):
        tt.op("function (A[N]) -> (O) { O = expp(A); }")
    with pytest.raises(tile.TileInputError, match="exists already"):
        tt.op(POOL, name="t_matmul")


def test_cached_per_shape_dtype_and_device():
    mm = tt.op(MATMUL, name="t_cache")
    for _ in range(3):
        mm(ints(2, 3), ints(3, 4))
    assert len(mm.core._runs) == 1
    mm(ints(2, 3, dtype=torch.float64), ints(3, 4, dtype=torch.float64))
    mm(ints(5, 3), ints(3, 4))
    assert len(mm.core._runs) == 3
    assert tt.op(MATMUL, name="t_cache") is mm


def test_zero_copy_on_cpu_and_non_contiguous_input_is_copied(monkeypatch, capfd):
    mm = tt.op(MATMUL, name="t_matmul")
    monkeypatch.setenv("TILE_DEBUG", "1")
    a, b = ints(4, 3), ints(4, 5)
    out = mm(a, b[:3])
    assert torch.equal(out, a @ b[:3])
    assert "t_matmul on llvm_cpu.0: zero-copy" in capfd.readouterr().err
    bt = ints(5, 3).T  # not contiguous
    assert torch.equal(mm(a, bt), a @ bt)
    assert "input 'B' was not contiguous: copied" in capfd.readouterr().err


def test_another_tile_device_copies_through_the_host(monkeypatch, capfd):
    if "opencl_cpu.0" not in registry.devices():
        pytest.skip("no opencl_cpu.0 (PoCL) device")
    mm = tt.op(MATMUL, name="t_matmul_ocl", device="opencl_cpu.0")
    monkeypatch.setenv("TILE_DEBUG", "1")
    a, b = ints(2, 3), ints(3, 4)
    assert torch.equal(mm(a, b), a @ b)
    assert "on opencl_cpu.0: host copies" in capfd.readouterr().err


@pytest.mark.skipif("opencl_gpu.0" not in registry.devices(), reason="no opencl_gpu.0 (an OpenCL GPU)")
def test_cpu_tensors_on_opencl_gpu_forward_and_gradients(monkeypatch, capfd):
    """The GPU path without CUDA tensors: host copies into opencl_gpu.0's buffers and back."""
    mm = tt.op(MATMUL, name="t_matmul_gpu", device="opencl_gpu.0")
    monkeypatch.setenv("TILE_DEBUG", "1")
    a, b = ints(5, 7), ints(7, 3, seed=1)
    assert torch.equal(mm(a, b), a @ b)
    assert "on opencl_gpu.0: host copies into and out of" in capfd.readouterr().err
    assert torch.autograd.gradcheck(mm, (f64(2, 3), f64(3, 4, seed=1)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for the opencl_gpu.0 path")
def test_cuda_tensors_run_on_opencl_gpu(monkeypatch, capfd):
    """In CUDA memory OpenCL shares where the device can (tests/test_cuda_share.py tests it), else
    through the host, saying why; with TILE_CUDA_SHARING=0 through the host always."""
    from backends.cuda.share import Sharing

    mm = tt.op(MATMUL, name="t_matmul_opencl", device="opencl_gpu.0")
    monkeypatch.setenv("TILE_DEBUG", "1")
    shared, why = Sharing.for_device(registry.get("opencl_gpu.0"))
    a, b = ints(2, 3).cuda(), ints(3, 4).cuda()
    out = mm(a, b)
    assert out.device == a.device and torch.equal(out, a @ b)
    err = capfd.readouterr().err
    if shared is not None:
        assert "on opencl_gpu.0: CUDA memory shared with OpenCL" in err
    else:
        host = "host copies (cuda -> host -> opencl_gpu.0 -> host -> cuda)"
        assert f"on opencl_gpu.0: {host}; CUDA memory not shared with OpenCL: {why}" in err
    monkeypatch.setenv("TILE_CUDA_SHARING", "0")
    assert torch.equal(mm(a, b), a @ b)
    assert "CUDA memory not shared with OpenCL: TILE_CUDA_SHARING=0" in capfd.readouterr().err
    a64, b64 = f64(2, 3).cuda().detach().requires_grad_(), f64(3, 4).cuda().detach().requires_grad_()
    assert torch.autograd.gradcheck(mm, (a64, b64))


def test_outputs_own_their_memory_across_calls():
    add = tt.op("function (A[N], B[N]) -> (C) { C = A + B; }", name="t_add")
    a, b = ints(8), ints(8, seed=1)
    first = add(a, b)
    kept = first.clone()
    second = add(b, b)  # a later call must not write into the tensor the first returned
    assert torch.equal(first, kept) and torch.equal(second, b + b)
    assert first.data_ptr() != second.data_ptr()
    assert not np.shares_memory(first.numpy(), a.numpy())


def test_torch_func_vmap_is_a_batch_loop():
    mm = tt.op(MATMUL, name="t_matmul")
    two = tt.op(TWO, name="t_two")
    a, b = ints(5, 2, 3), ints(3, 4, seed=1)
    assert torch.equal(torch.func.vmap(mm, in_dims=(0, None))(a, b), a @ b)
    x, w = ints(4, 3, 2), ints(2, seed=2)
    y, s = torch.func.vmap(two, in_dims=(1, None))(x, w)
    assert torch.equal(y, torch.tanh(x * w).transpose(0, 1)) and torch.equal(s, (x * x).sum(2).T)


def test_settings_reach_tile_compile():
    mm = tt.op(MATMUL, name="t_settings", settings={"threads": 1})
    a, b = ints(2, 3), ints(3, 4)
    assert torch.equal(mm(a, b), a @ b)
    with pytest.raises(tile.TileSettingsError, match="stirct"):
        tt.op(MATMUL, name="t_settings_bad", settings={"stirct": True})


def test_eager_shortcuts_do_what_the_dispatcher_does():
    """Plain eager calls skip the dispatcher (``PLAIN``: no gradient needed; ``AUTOGRAD``: through
    a torch.autograd.Function); their values and gradients are the registered operator's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mm = tt.op(MATMUL, name="t_matmul")
    a, b = f64(2, 3), f64(3, 4, seed=1)
    assert tt._eager_kind((a, b)) == tt.AUTOGRAD
    with torch.no_grad():
        assert tt._eager_kind((a, b)) == tt.PLAIN
    direct, registered = mm(a, b), mm.op(a, b)
    assert torch.equal(direct, registered)
    for g, h in zip(torch.autograd.grad(direct.sum(), (a, b)), torch.autograd.grad(registered.sum(), (a, b))):
        assert torch.equal(g, h)
    with FakeTensorMode() as mode:  # a dispatch mode: through torch.ops.tile and its fake kernel
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
        assert tt._eager_kind((fa, fb)) == tt.DISPATCH
        assert mm(fa, fb).shape == (2, 4)


def test_higher_derivatives_differentiate_the_gradient_program():
    """create_graph=True: the gradient program runs as a tile.torch op of its own, whose backward
    is Tile's gradient of it (gradgradcheck; a third derivative against PyTorch's)."""
    mm = tt.op(MATMUL, name="t_matmul")
    assert torch.autograd.gradgradcheck(mm, (f64(2, 3), f64(3, 4, seed=1)))
    f = tt.op("function (X[N]) -> (Y) { Y = tanh(X) * X; }", name="t_tanh_x")
    x = f64(5)
    assert torch.autograd.gradgradcheck(f, (x,))

    def third(fn, x):
        (g1,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        (g2,) = torch.autograd.grad(g1.sum(), x, create_graph=True)
        return torch.autograd.grad(g2.sum(), x)[0]

    assert torch.allclose(third(f, x), third(lambda x: torch.tanh(x) * x, x), rtol=1e-12, atol=1e-12)
    via_dispatcher = third(f.op, x)  # the registered autograd formula does the same
    assert torch.allclose(via_dispatcher, third(f, x), rtol=1e-12, atol=1e-12)


def test_scalars_narrow_floats_empty_tensors_and_the_interpreter():
    src = "function (A[N], S[]) -> (O, T) { O = A * S; T[] = +(A[i]); }"
    scaled = tt.op(src, name="t_scalar")
    a, s = torch.arange(4.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    o, t = scaled(a, s)
    assert t.shape == () and torch.equal(o, a.detach() * 3) and float(t) == 6
    (o.sum() + t).backward()
    assert torch.equal(a.grad, torch.full((4,), 4.0)) and float(s.grad) == 6
    assert "TileEagerFunctionBackward" in str(o.grad_fn)  # eager: Tile's autograd.Function
    exact = tt.op(src, name="t_scalar_interp", device="interp")  # any Tile device
    assert all(torch.equal(x, y) for x, y in zip(exact(a.detach(), s.detach()), (o.detach(), t.detach())))
    square = tt.op("function (A[N]) -> (O) { O = A * A; }", name="t_square")
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.arange(4, dtype=dtype, requires_grad=True)
        y = square(x)
        y.sum().backward()
        assert y.dtype == dtype and torch.equal(y, x.detach() ** 2) and torch.equal(x.grad, 2 * x.detach())
    assert square(torch.ones(0)).shape == (0,)
    to_bf16 = tt.op("function (A[N]) -> (O, P) { O = as_bfloat(A, 16); P = A * 2; }", name="t_to_bf16")
    o, p = to_bf16(torch.arange(3.0))  # a bfloat16 output from float32 inputs
    assert o.dtype == torch.bfloat16 and torch.equal(o, torch.arange(3.0, dtype=torch.bfloat16))
