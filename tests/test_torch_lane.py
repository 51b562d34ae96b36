"""tile.torch's fast lane (tile/torch_lane.py, backends/lane.py): a call at a signature the op has
run at goes straight to the kernels on the tensors' memory, with the general path's results."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
tt = pytest.importorskip("tile.torch", reason="tile.torch needs PyTorch")

from backends.lane import NATIVE_AFTER  # noqa: E402
from backends.runner import CompiledProgram  # noqa: E402
from tests.torch_routes import call_route  # noqa: E402, F401
from tile.torch_lane import TorchLane, signature  # noqa: E402

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"


pytestmark = pytest.mark.usefixtures("call_route")  # (each test on both routes: tests/torch_routes.py)

def ints(*shape, seed=0, dtype=torch.float32):
    return torch.from_numpy(np.random.default_rng(seed).integers(-3, 4, shape)).to(dtype)


@pytest.fixture
def no_general_path(monkeypatch):
    """Make the general path fail: a call that passes took the lane."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("the general path ran")

    def on():
        monkeypatch.setattr(CompiledProgram, "run", refuse)

    return on


def test_second_call_takes_the_lane_with_the_general_paths_results(no_general_path):
    mm = tt.op(MATMUL, name="lane_mm")
    a, b = ints(5, 7), ints(7, 3, seed=1)
    first = mm(a, b)
    lane = mm._lanes[signature((a, b))]
    assert isinstance(lane, TorchLane)
    no_general_path()
    for seed in range(3):  # new values at the same signature: the lane, exact
        a, b = ints(5, 7, seed=seed + 2), ints(7, 3, seed=seed + 9)
        assert torch.equal(mm(a, b), a @ b)
    assert first.data_ptr() != mm(a, b).data_ptr()  # each call its own output


def test_outputs_the_program_leaves_unwritten_are_zeros():
    """Only the even places of O are summed into: zero where nothing is (the program's own fill,
    or the lane's ``torch.zeros`` where the program needs it zeroed; torch.empty's memory must
    never show through)."""
    spread = tt.op("function (A[N]) -> (O) { O[2 * i: 2 * N] = +(A[i]); }", name="lane_spread")
    a = torch.arange(1.0, 6.0)
    want = torch.zeros(10)
    want[::2] = a
    assert torch.equal(spread(a), want)
    assert isinstance(spread._lanes[signature((a,))], TorchLane)
    garbage = torch.full((10,), 7.0)  # (the allocator may hand this memory out next)
    del garbage
    for k in range(3):
        got = spread(a * (k + 2))
        want[::2] = a * (k + 2)
        assert torch.equal(got, want)


def test_shared_and_strided_inputs_take_the_general_path_correctly():
    add = tt.op("function (A[N, M], B[N, M]) -> (C) { C = A + 2 * B; }", name="lane_add2")
    x, y = ints(4, 4), ints(4, 4, seed=1)
    assert torch.equal(add(x, y), x + 2 * y)
    assert isinstance(add._lanes[signature((x, y))], TorchLane)
    assert torch.equal(add(x, x), 3 * x)  # one tensor twice
    t = ints(4, 4, seed=2).t()  # not contiguous, same signature
    assert not t.is_contiguous() and signature((t, y)) == signature((x, y))
    assert torch.equal(add(t, y), t + 2 * y)


def test_several_outputs_and_integer_outputs():
    two = tt.op("function (A[N], B[N]) -> (S, P) { S = A + B; P = A * B; }", name="lane_two")
    for seed in range(3):
        a, b = ints(6, seed=seed, dtype=torch.int32), ints(6, seed=seed + 5, dtype=torch.int32)
        s, p = two(a, b)
        assert s.dtype == torch.int32 and torch.equal(s, a + b) and torch.equal(p, a * b)


def test_the_backward_takes_a_lane_too(no_general_path):
    mm = tt.op(MATMUL, name="lane_mm_grad")
    a, b = ints(4, 6).requires_grad_(), ints(6, 5, seed=1).requires_grad_()
    g = ints(4, 5, seed=2)
    mm(a, b).backward(g)  # the general path, both directions
    assert any(isinstance(v, TorchLane) for v in mm._grad_lanes.values())
    no_general_path()
    _exact_matmul_grads(mm, (4, 6, 5), _backward_by(g))


def _backward_by(g):
    """A ``backward`` for ``_exact_matmul_grads``: the product's backward with cotangent ``g``."""

    def run(out, _seed):
        out.backward(g)
        return g

    return run


def _exact_matmul_grads(mm, shape, backward) -> None:
    """Three new (A, B) of ``shape`` (M, K, N) at one signature, each product's ``backward(out,
    seed)`` run (it returns the cotangent it used): the gradients exact."""
    m, k, n = shape
    for seed in range(3):
        a = ints(m, k, seed=seed + 3).requires_grad_()
        b = ints(k, n, seed=seed + 7).requires_grad_()
        g = backward(mm(a, b), seed)
        assert torch.equal(a.grad, g @ b.detach().t()) and torch.equal(b.grad, a.detach().t() @ g)


def test_a_missing_cotangent_and_a_broadcast_gradient():
    """One output unused (its cotangent is None: zeros, on the general path) and a gradient the
    program keeps smaller than its input (a scalar's)."""
    src = "function (A[N], S[]) -> (O, T) { O = A * S; T[] = +(A[i]); }"
    f = tt.op(src, name="lane_scalar")
    for k in range(3):
        a = (torch.arange(4.0) + k).requires_grad_()
        s = torch.tensor(3.0 + k, requires_grad=True)
        o, t = f(a, s)
        o.sum().backward()  # T unused
        assert torch.equal(a.grad, torch.full((4,), 3.0 + k)) and float(s.grad) == float(a.detach().sum())
        a.grad = s.grad = None
        o, t = f(a, s)
        (o.sum() + t).backward()
        assert torch.equal(a.grad, torch.full((4,), 4.0 + k)) and s.grad.shape == ()


def test_temporaries_the_program_zeroes_each_call():
    """A two-statement program whose temporary T is a sum: the lane zeroes it before each call
    (else the second call's sums would start from the first's)."""
    src = """function (A[N, M]) -> (O) {
        T[i: N] = +(A[i, j]);
        O[i: N] = +(T[i] * A[i, j]);
    }"""
    f = tt.op(src, name="lane_temp")
    for seed in range(4):
        a = ints(3, 5, seed=seed)
        want = a.sum(1) * a.sum(1)
        assert torch.equal(f(a), want)


def test_lanes_are_bounded_and_debug_takes_the_general_path(monkeypatch, capfd):
    add = tt.op("function (A[N]) -> (C) { C = A + 1; }", name="lane_bound")
    for n in range(1, tt.LANES_KEPT + 6):
        assert torch.equal(add(torch.ones(n)), torch.full((n,), 2.0))
    assert len(add._lanes) == tt.LANES_KEPT
    x = torch.ones(3)
    add(x)
    monkeypatch.setenv("TILE_DEBUG", "1")
    assert torch.equal(add(x), torch.full((3,), 2.0))
    assert "tile.torch: lane_bound" in capfd.readouterr().err


def test_generic_kernels_take_their_extents_through_the_lane(no_general_path):
    """With the ``generic`` setting a kernel built for a bucket reads its sizes from an extents
    array after the buffers: the lane passes it too."""
    f = tt.op("function (A[N], B[N]) -> (C) { C = A * B + A; }", name="lane_generic",
              settings={"generic": True})
    for n in (5, 7, 9):  # the second length makes the kernel generic
        a, b = ints(n, seed=n), ints(n, seed=n + 1)
        assert torch.equal(f(a, b), a * b + a)
    no_general_path()
    for seed in range(3):
        a, b = ints(9, seed=seed + 20), ints(9, seed=seed + 30)
        assert torch.equal(f(a, b), a * b + a)


def test_the_lane_launches_what_the_runner_launches():
    """A kernel the backend built with nothing to do (a matmul's fill the micro-kernel took over,
    ``Library.extra['skipped']``) is left out of the lane as out of the runner's calls."""
    mm = tt.op(MATMUL, name="lane_mm_order")
    a, b = ints(6, 5), ints(5, 7, seed=1)
    mm(a, b)
    lane = mm._lanes[signature((a, b))].lane
    assert len(lane._plan) == len(lane.program._order) < len(lane.program.kernels)  # (the fill: skipped)
    assert torch.equal(mm(a, b), a @ b)


def _grad_lane(op):
    (lane,) = [v for v in op._grad_lanes.values() if v is not None]
    return lane


def test_a_gradient_that_is_its_cotangent_is_the_cotangent(no_general_path):
    """``Z = X + Y``'s gradients are ``DX = DZ; DY = DZ``: two copy kernels on the general path; on
    the backward's lane they are the cotangent itself (as torch's own add backward gives), no
    copy run, and each ``.grad`` still its own tensor with the right values."""
    add = tt.op("function (X[N], Y[N]) -> (Z) { Z = X + Y; }", name="lane_alias_add")
    x, y = torch.arange(3.0).requires_grad_(), torch.ones(3, requires_grad=True)
    add(x, y).backward(torch.full((3,), 2.0))  # the general path
    lane = _grad_lane(add)
    assert lane.lane.aliases == {0: 2, 1: 2} and lane.lane._plan == []
    no_general_path()
    g = ints(3, seed=4)
    dx, dy = torch.autograd.grad(add(x, y), (x, y), g)
    assert torch.equal(dx, g) and torch.equal(dy, g)
    x.grad = y.grad = None
    add(x, y).backward(g)
    add(x, y).backward(g)  # accumulated: x.grad and y.grad must not share memory
    assert torch.equal(x.grad, 2 * g) and torch.equal(y.grad, 2 * g)
    assert x.grad.data_ptr() != y.grad.data_ptr()


def test_copies_that_move_or_convert_values_still_run(no_general_path):
    """A transposed copy and a copy between dtypes are not their cotangents: their kernels run."""
    tr = tt.op("function (X[N, M]) -> (Z) { Z[j, i: M, N] = =(X[i, j]); }", name="lane_alias_tr")
    x = ints(2, 3).requires_grad_()
    g = ints(3, 2, seed=5)
    tr(x).backward(g)
    assert _grad_lane(tr).lane.aliases == {}
    cast = tt.op("function (X[N]) -> (Z) { Z = as_float(X, 32); }", name="lane_alias_cast")
    xd = torch.arange(4.0, dtype=torch.float64).requires_grad_()
    cast(xd).backward(torch.ones(4))
    assert _grad_lane(cast).lane.aliases == {}
    no_general_path()
    x.grad = None
    tr(x).backward(g)
    assert torch.equal(x.grad, g.t())
    xd.grad = None
    cast(xd).backward(torch.full((4,), 3.0))
    assert xd.grad.dtype == torch.float64 and torch.equal(xd.grad, torch.full((4,), 3.0, dtype=torch.float64))


def test_a_lane_of_several_kernels_is_one_native_call(no_general_path):
    """A matmul's backward (two products) on one thread: one native call (``Lane._one_call``) with
    the kernel-by-kernel plan's results."""
    mm = tt.op(MATMUL, name="lane_mm_native", settings={"threads": 1})
    a, b = ints(6, 5).requires_grad_(), ints(5, 4, seed=1).requires_grad_()
    g = ints(6, 4, seed=2)
    mm(a, b).backward(g)
    lane = _grad_lane(mm)
    assert not lane.lane.native  # (built only once the lane has run NATIVE_AFTER times)
    for _ in range(NATIVE_AFTER):
        mm(a, b).backward(g)
    assert lane.lane.native and len(lane.lane._plan) == 1
    assert len(lane.lane.program._order) > 1
    no_general_path()
    _exact_matmul_grads(mm, (6, 5, 4), _backward_by(g))


def test_a_loss_sums_broadcast_cotangent_takes_the_backward_lane(no_general_path):
    """``op(x).sum().backward()`` hands the backward a cotangent of stride 0 (one value broadcast):
    the lane copies it contiguous, as the general path does, instead of leaving every such
    backward to the general path."""
    mm = tt.op(MATMUL, name="lane_mm_sum")
    a, b = ints(4, 6).requires_grad_(), ints(6, 5, seed=1).requires_grad_()
    mm(a, b).sum().backward()  # the general path, both directions
    assert isinstance(_grad_lane(mm), TorchLane)
    no_general_path()

    def loss(out, seed):  # (the first through a product by 1: a contiguous cotangent)
        (out * 1 if seed == 0 else out).sum().backward()
        return torch.ones(4, 5)

    _exact_matmul_grads(mm, (4, 6, 5), loss)


def test_a_plain_call_again_is_one_function(monkeypatch):
    """After a plain call (no gradient wanted) the op keeps its lane as one function
    (``tile.torch_hot.HotCall``) that checks and launches in one pass; it takes the next plain
    calls at that signature (nothing else ran: the lane's ordinary call and the general path
    refused), and gives every other call back to the usual path, with the usual results."""
    two = tt.op("function (A[N], B[N]) -> (S, P) { S = A + B; P = A * B; }", name="lane_plain_two")
    a, b = ints(6), ints(6, seed=1)
    two(a, b)
    hot = two._hot
    assert hot is not None

    def refuse(*args, **kwargs):
        raise AssertionError("not the one-function path")

    with monkeypatch.context() as m:
        m.setattr(CompiledProgram, "run", refuse)
        m.setattr(TorchLane, "__call__", refuse)
        for seed in range(3):
            a, b = ints(6, seed=seed + 2), ints(6, seed=seed + 7)
            s, p = two(a, b)
            assert torch.equal(s, a + b) and torch.equal(p, a * b)
        with torch.no_grad():  # a tensor that wants a gradient, but no grad mode: still plain
            s, _ = two(a.requires_grad_(), b)
            assert s.grad_fn is None and torch.equal(s, a + b)
        a = a.detach()
    # each of these is refused by the one function, and right through the usual path
    assert hot((a, b, b)) is None  # (a wrong count: the usual path's arity error)
    assert hot((a, a)) is None and torch.equal(two(a, a)[1], a * a)  # one tensor twice
    strided = ints(12, seed=3)[::2]
    assert hot((strided, b)) is None and torch.equal(two(strided, b)[0], strided + b)
    assert hot((a.double(), b.double())) is None
    assert hot((ints(7), ints(7))) is None
    g = a.clone().requires_grad_()
    s, _ = hot((g, b))  # (a gradient call: the one function too, ``tests/test_torch_hot.py``)
    assert s.grad_fn is not None and two._hot in (hot, two._lanes[signature((a, b))].hot.call)  # (compiled)
    s.sum().backward()
    assert torch.equal(g.grad, torch.ones(6))

    class Seen(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():  # a mode sees the call: through the dispatcher, not the one function
        assert two._hot((a, b)) is None
        assert torch.equal(two(a, b)[0], a + b)
    monkeypatch.setenv("TILE_DEBUG", "1")
    assert two._hot((a, b)) is None
