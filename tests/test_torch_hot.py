"""tile.torch's hot path (tile/torch_hot.py): an eager call at a kept signature, with or without a
gradient, checked and launched in one function; every check still sends what it must back to the
usual path, whose results (or errors) are the right ones."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
tt = pytest.importorskip("tile.torch", reason="tile.torch needs PyTorch")

from backends.runner import CompiledProgram  # noqa: E402
from tests.torch_routes import call_route  # noqa: E402, F401
from tile.errors import TileInputError  # noqa: E402
from tile.torch_hot import HotCall, TileHotFunction  # noqa: E402
from tile.torch_lane import TorchLane, signature  # noqa: E402

ADD = "function (X[N], Y[N]) -> (Z) { Z = X + Y; }"
MUL = "function (X[N], Y[N]) -> (Z) { Z = X * Y; }"


pytestmark = pytest.mark.usefixtures("call_route")  # (each test on both routes: tests/torch_routes.py)

def ints(*shape, seed=0, dtype=torch.float32):
    return torch.from_numpy(np.random.default_rng(seed).integers(-3, 4, shape)).to(dtype)


def _only_hot(m):
    """Make every other path fail: the general one, the lane's ordinary call, the eager
    ``autograd.Function`` and the general backward."""

    def refuse(*args, **kwargs):
        raise AssertionError("not the hot path")

    import tile.torch_hot as hot_module

    m.setattr(CompiledProgram, "run", refuse)
    m.setattr(TorchLane, "__call__", refuse)
    m.setattr(tt, "eager_apply", refuse)
    m.setattr(hot_module, "backward_of", refuse)


def _warm(op, x, y, g):
    """Two calls with their backward at this signature: the general path keeps both lanes."""
    for _ in range(2):
        op(x, y).backward(g)
    x.grad = y.grad = None


def test_a_call_with_a_gradient_takes_the_hot_path_both_ways(monkeypatch):
    mul = tt.op(MUL, name="hot_mul")
    x, y = ints(5).requires_grad_(), ints(5, seed=1).requires_grad_()
    _warm(mul, x, y, ints(5, seed=2))
    assert isinstance(mul._lanes[signature((x, y))].hot, HotCall)
    with monkeypatch.context() as m:
        _only_hot(m)
        for seed in range(3):  # new values, same signature: exact, through the hot path only
            x, y = ints(5, seed=seed + 3).requires_grad_(), ints(5, seed=seed + 6).requires_grad_()
            g = ints(5, seed=seed + 9)
            z = mul(x, y)
            assert type(z.grad_fn).__name__ == "TileHotFunctionBackward"
            z.backward(g)
            assert torch.equal(z, x * y) and torch.equal(x.grad, g * y) and torch.equal(y.grad, g * x)
        y = ints(5, seed=4)  # one input needs no gradient: its own backward lane, learned first
    out = mul(x, y)
    out.backward(torch.ones(5))
    x.grad = None
    with monkeypatch.context() as m:
        _only_hot(m)
        mul(x, y).backward(g)
        assert torch.equal(x.grad, g * y) and y.grad is None


def test_the_hot_backward_declines_what_it_must(monkeypatch):
    """Each of these backward calls is refused by the hot backward (the general one runs: it is
    counted) and right: a gradient differentiated again (``create_graph``), a negative-view
    cotangent, a dispatch mode around the backward. A strided cotangent (``loss.sum()``'s: stride
    0) is copied contiguous and stays on the hot backward."""
    mul = tt.op(MUL, name="hot_mul_declines")
    x, y = ints(4).requires_grad_(), ints(4, seed=1).requires_grad_()
    _warm(mul, x, y, ints(4, seed=2))
    import tile.torch_hot as hot_module

    general = []
    real = hot_module.backward_of
    monkeypatch.setattr(hot_module, "backward_of", lambda *a: general.append(1) or real(*a))

    dx, = torch.autograd.grad(mul(x, y), x, torch.ones(4), create_graph=True)
    assert torch.equal(dx, y) and general == [1]
    ddy, = torch.autograd.grad(dx, y, torch.full((4,), 2.0))  # d(dx)/dy = 1, times 2
    assert torch.equal(ddy, torch.full((4,), 2.0))

    g = ints(8, seed=5)
    x.grad = None
    mul(x, y).backward(g[::2])
    assert torch.equal(x.grad, g[::2] * y) and len(general) == 1
    x.grad = None
    mul(x, y).sum().backward()
    assert torch.equal(x.grad, y) and len(general) == 1

    x.grad = None
    neg = torch._neg_view(g[:4].clone())
    mul(x, y).backward(neg)
    assert torch.equal(x.grad, -g[:4] * y) and len(general) == 2

    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x.grad = None
    z = mul(x, y)
    with Seen():
        z.backward(g[:4])
    assert torch.equal(x.grad, g[:4] * y) and len(general) == 3

    x.grad = None
    mul(x, y).backward(g[:4])  # (nothing unusual: the hot backward, the general one not counted)
    assert torch.equal(x.grad, g[:4] * y) and len(general) == 3


def test_an_inputs_change_in_place_is_still_refused():
    """The hot backward unpacks the saved inputs: one changed in place since the forward is
    torch's error, as on the general path."""
    mul = tt.op(MUL, name="hot_mul_version")
    x, y = ints(3).requires_grad_(), ints(3, seed=1).requires_grad_()
    _warm(mul, x, y, torch.ones(3))
    w = y.detach()
    z = mul(x, y)
    w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward(torch.ones(3))


def test_integer_outputs_are_not_differentiable_on_the_hot_path():
    two = tt.op("function (X[N]) -> (Y, I) { Y = X * X; I = as_int(X, 32); }", name="hot_int_out")
    x = ints(4).requires_grad_()
    for _ in range(3):
        y, i = two(x)
    assert type(y.grad_fn).__name__ == "TileHotFunctionBackward"
    assert i.dtype == torch.int32 and not i.requires_grad
    y.backward(torch.ones(4))
    assert torch.equal(x.grad, 2 * x.detach())


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "kept signature"])
def test_tensors_whose_memory_is_not_their_values(warm):
    """A negative view (its memory holds the values negated), a ZeroTensor (no memory), a tensor
    left over from a finished ``torch.func`` transform: the right values on every path (a kept
    lane read the negative view's memory as it is, and called the kernel on address 0)."""
    add = tt.op(ADD, name=f"hot_views_{warm}")
    x, y = ints(3), ints(3, seed=1)
    if warm:
        for _ in range(3):
            add(x, y)
        assert add._hot is not None
    neg = torch._neg_view(y)
    assert torch.equal(add(x, neg), x - y)
    zero = torch._efficientzerotensor(3)
    assert torch.equal(add(x, zero), x)
    box = []
    torch.func.grad(lambda a: box.append(a) or a.sum())(y.clone())
    assert torch.equal(add(x, box[0]), x + y)
    assert torch.equal(add(x, y), x + y)


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "kept signature"])
def test_tensors_tile_cannot_read_are_clear_errors(warm):
    add = tt.op(ADD, name=f"hot_refused_{warm}")
    x, y = ints(3), ints(3, seed=1)
    if warm:
        for _ in range(3):
            add(x, y)
    with pytest.raises(TileInputError, match="(?s)sparse_coo tensor.*to_dense"):
        add(x, y.to_sparse())
    with pytest.raises(TileInputError, match="no memory of its own"):
        add(x, torch._to_functional_tensor(y))


def test_the_function_is_applied_only_where_nothing_watches(monkeypatch):
    """Under a torch function mode the hot path declines a gradient call too (the dispatcher's)."""
    add = tt.op(ADD, name="hot_modes")
    x, y = ints(3).requires_grad_(), ints(3, seed=1)
    for _ in range(3):
        add(x, y)
    hot = add._hot
    assert hot is not None

    class Seen(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        assert hot((x, y)) is None
        z = add(x, y)
    assert type(z.grad_fn).__name__ != "TileHotFunctionBackward" and torch.equal(z, x + y)
    with torch.no_grad():  # (below autograd's reach: the plain launch)
        assert hot((x, y)).grad_fn is None
    assert TileHotFunction is not None


def test_the_hot_backward_checks_the_places_its_lane_uses():
    """``Z = X + Y``'s backward lane uses only the cotangent (both gradients are it); ``Z = X * Y``'s
    reads all three: the hot backward checks exactly those (``Lane.used``)."""
    add, mul = tt.op(ADD, name="hot_used_add"), tt.op(MUL, name="hot_used_mul")
    x, y = ints(3).requires_grad_(), ints(3, seed=1).requires_grad_()
    for op, used in ((add, {2}), (mul, {0, 1, 2})):
        _warm(op, x, y, torch.ones(3))
        lane, = [v for v in op._grad_lanes.values() if v is not None]
        assert lane.lane.used == used
        g = ints(3, seed=2)
        op(x, y).backward(g)
        want = (g, g) if op is add else (g * y, g * x)
        assert torch.equal(x.grad, want[0]) and torch.equal(y.grad, want[1])
        x.grad = y.grad = None


def test_the_checker_of_a_signature():
    """``checker``'s unrolled checks: addresses for right tensors, None for each wrong one."""
    from tile.torch_hot import checker

    x, y = ints(3), ints(3, seed=1)
    types = ((torch.float32, x.shape), (torch.float32, x.shape))
    check = checker(types, distinct=True)
    assert check((x, y)) == [x.data_ptr(), y.data_ptr()]
    for wrong in (x.double(), ints(4), ints(6)[::2], torch._neg_view(y), torch._efficientzerotensor(3),
                  x.to_sparse(), x):  # (x: one tensor twice)
        assert check((x, wrong)) is None
    assert checker(types, distinct=False)((x, x)) == [x.data_ptr()] * 2
    assert checker(types, (False, True))((None, y)) == [0, y.data_ptr()]
    assert checker(())(()) == [] and checker(())((x,)) is None


def test_a_modules_parameters_take_the_hot_path(monkeypatch):
    """``nn.Parameter`` disables ``__torch_function__``: a module's weight is a plain tensor to
    torch, and to the eager and hot paths (before: every call with one went through the
    dispatcher, 55 us a 4-element product). A subclass that overrides it still dispatches."""
    mul = tt.op(MUL, name="hot_parameter")
    w = torch.nn.Parameter(ints(4, seed=1))
    x = ints(4)
    _warm(mul, x, w, torch.ones(4))
    w.grad = None
    with monkeypatch.context() as m:
        _only_hot(m)
        z = mul(x, w)
        assert type(z.grad_fn).__name__ == "TileHotFunctionBackward"
        z.sum().backward()
    assert torch.equal(z, x * w) and torch.equal(w.grad, x)

    class Logged(torch.Tensor):
        seen = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.seen.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    v = ints(4, seed=2).as_subclass(Logged)
    assert mul._hot((x, v)) is None
    Logged.seen.clear()
    assert torch.equal(mul(x, v).as_subclass(torch.Tensor), x * v.as_subclass(torch.Tensor))
    assert Logged.seen  # (it saw the call: the dispatcher's path)


def test_the_usual_calls_function_declines_what_it_must():
    """The usual lane's call (one output made like an input: written out per signature,
    ``HotCall._usual``) refuses each wrong call, which the usual path then gets right."""
    add = tt.op(ADD, name="hot_usual")
    x, y = ints(3), ints(3, seed=1)
    for _ in range(3):
        add(x, y)
    hot = add._hot
    assert hot((x, y)) is not None and torch.equal(hot((x, y)), x + y)
    for wrong in ((x.double(), y.double()), (ints(4), ints(4)), (ints(6)[::2], y), (x, x), (x,),
                  (x, torch._neg_view(y)), (x, torch._efficientzerotensor(3)), (x, 1.0)):
        assert hot(wrong) is None, wrong
    assert torch.equal(add(x, x), 2 * x) and torch.equal(add(ints(6)[::2], y), ints(6)[::2] + y)
    assert torch.equal(add(x.double(), y.double()), (x + y).double())


def test_torch_compile_traces_past_a_kept_hot_path():
    """Dynamo traces into the op's call, hot path first: ``watched`` sees the compile and the op
    becomes one graph node (``fullgraph``: no break), forward and backward."""
    add = tt.op(ADD, name="hot_compiled")
    x, y = ints(3), ints(3, seed=1)
    xg = x.clone().requires_grad_()
    for _ in range(3):
        add(x, y)
        add(xg, y).sum().backward()
    assert add._hot is not None
    f = torch.compile(lambda a, b: add(a, b).sum() * 2, fullgraph=True, backend="aot_eager")
    xg.grad = None
    out = f(xg, y)
    out.backward()
    assert torch.equal(out, (x + y).sum() * 2) and torch.equal(xg.grad, torch.full((3,), 2.0))
