"""A ``tile.torch`` op's usual call compiled to C (tile/torch_hot.py ``compiled_call``,
backends/llvm/callentry.py): taken at a kept signature once the lane has its entry, with the lane's
results; declining (None, nothing run, no error left set) every call the Python path declines, and
then the usual path gets it right. The hot path's own tests run on this route too
(tests/torch_routes.py)."""

import dataclasses
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
tt = pytest.importorskip("tile.torch", reason="tile.torch needs PyTorch")

import torch.autograd.forward_ad as fwAD  # noqa: E402

from backends.lane import NATIVE_AFTER  # noqa: E402
from backends.llvm.callentry import call_entry  # noqa: E402
from backends.runner import CompiledProgram  # noqa: E402
from tests.torch_routes import in_threads  # noqa: E402
from tile.errors import TileError  # noqa: E402
from tile.torch_hot import compiled_calls  # noqa: E402
from tile.torch_lane import TorchLane, signature  # noqa: E402

ADD = "function (X[N], Y[N]) -> (Z) { Z = X + Y; }"
pytestmark = pytest.mark.skipif(not compiled_calls(), reason="calls are compiled on CPython only")


def ints(*shape, seed=0, dtype=torch.float32):
    return torch.from_numpy(np.random.default_rng(seed).integers(-3, 4, shape)).to(dtype)


@pytest.fixture(autouse=True, params=["guards", "reads"])
def tensor_checks(request, monkeypatch):
    """Each test with the tensors checked as one (``_guards``) and read one by one."""
    import tile.torch_hot as hot_module

    monkeypatch.setattr(hot_module, "TENSOR_GUARDS", request.param == "guards")
    return request.param


def _compiled(name: str, n: int = 3):
    """An add whose call at ``(n,)`` float32 tensors is compiled, its compiled builtin (whose
    declines go to the Python path's function), and its ``HotCall``."""
    import tile.torch_hot as hot_module

    add = tt.op(ADD, name=f"{name}_{'guards' if hot_module.TENSOR_GUARDS else 'reads'}")
    x, y = ints(n), ints(n, seed=1)
    for _ in range(NATIVE_AFTER + 2):
        assert torch.equal(add(x, y), x + y)
    hot = add._lanes[signature((x, y))].hot
    assert hot.entry is not None and add._hot is hot.entry.fn
    assert (hot.entry.plan.guards is not None) == hot_module.TENSOR_GUARDS
    return add, hot.entry.fn, hot


def _alone(hot):
    """The same builtin declining to None, not to the Python path: what its own checks decline."""
    return call_entry(dataclasses.replace(hot.entry.plan, otherwise=None)).fn


def _refuse(m, *more):
    def refuse(*args, **kwargs):
        raise AssertionError("not the compiled call")

    for owner, name in ((CompiledProgram, "run"), (TorchLane, "__call__"), (tt, "eager_apply"), *more):
        m.setattr(owner, name, refuse)


def test_a_kept_signatures_call_is_compiled_and_taken(monkeypatch, tensor_checks):
    add, fn, hot = _compiled("compiled_taken")
    alone = _alone(hot)  # (None where its own checks decline: a result is its own)
    with monkeypatch.context() as m:
        _refuse(m)
        for seed in range(4):
            x, y = ints(3, seed=seed + 2), ints(3, seed=seed + 7)
            z = add(x, y)
            assert torch.equal(z, x + y) and z.grad_fn is None
            assert torch.equal(fn((x, y)), x + y) and torch.equal(alone((x, y)), x + y)
        w = torch.nn.Parameter(ints(3, seed=3))  # (no gradient wanted: a plain type; the guards'
        with torch.no_grad():  # example is a Tensor: declined, to the Python path)
            assert torch.equal(add(x, w), x + w)
            assert (alone((x, w)) is None) == (tensor_checks == "guards")
    with monkeypatch.context() as m:  # a gradient wanted: ``TileHotFunction`` from the builtin
        _refuse(m)
        xg, yg = ints(3, seed=4).requires_grad_(), ints(3, seed=5).requires_grad_()
        z = alone((xg, yg))
        assert type(z.grad_fn).__name__ == "TileHotFunctionBackward" and torch.equal(z, xg + yg)
        with torch.no_grad():  # (below autograd: the plain call)
            assert alone((xg, yg)).grad_fn is None
        z = add(xg, y)  # (one of two: the guards' declined, to the Python path's)
        assert type(z.grad_fn).__name__ == "TileHotFunctionBackward" and torch.equal(z, xg + y)
        assert (alone((xg, y)) is None) == (tensor_checks == "guards")
    z.backward(torch.ones(3))  # (its first: the general backward, which keeps its lane)
    assert torch.equal(xg.grad, torch.ones(3))


def test_the_compiled_call_declines_each_tensor_the_python_path_declines():
    add, _, hot = _compiled("compiled_tensors")
    fn = _alone(hot)
    x, y = ints(3), ints(3, seed=1)

    class Sub(torch.Tensor):
        pass

    wrong = [
        (x,), (x, y, x), [x, y], (x, 1.0), (x, None), (x, y.double()), (x, ints(4)), (x, ints(3, 1)),
        (x, ints(6)[::2]), (x, torch._neg_view(y)), (x, torch._efficientzerotensor(3)), (x, y.to_sparse()),
        (x, torch._to_functional_tensor(y)), (x, x), (x, torch.empty(3, device="meta")),
        (x, y.as_subclass(Sub)), (x, ints(3)[None][0:1].view(3)),
    ]
    for args in wrong[:-1]:
        assert fn(args) is None, args
    assert torch.equal(fn(wrong[-1]), x + x)  # (a view that is contiguous: taken)
    assert torch.equal(add(x, torch._neg_view(y)), x - y) and torch.equal(add(x, x), 2 * x)
    assert torch.equal(add(x, ints(6)[::2]), x + ints(6)[::2])
    assert torch.equal(add(x.double(), y.double()), (x + y).double())
    assert torch.equal(fn((x, y)), x + y)  # (no error left set by the declines)


def test_the_compiled_call_declines_where_anything_watches(monkeypatch):
    add, _, hot = _compiled("compiled_watched")
    fn = _alone(hot)
    x, y = ints(3), ints(3, seed=1)

    class Function(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Dispatch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for mode in (Function, Dispatch):
        with mode():
            assert fn((x, y)) is None
            assert torch.equal(add(x, y), x + y)
    with fwAD.dual_level():
        assert fn((x, y)) is None
    seen = []
    torch.func.vmap(lambda a: seen.append(fn((x, y))) or a)(torch.ones(2, 1))
    with warnings.catch_warnings():  # (deprecated; check_trace: its check runs untraced)
        warnings.simplefilter("ignore")
        torch.jit.trace(lambda a, b: seen.append(fn((a, b))) or a * 1, (x, y), check_trace=False)
    assert seen == [None, None]
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, "_is_compiling_flag", True)  # (non-strict export's)
        assert fn((x, y)) is None
    with monkeypatch.context() as m:
        m.setenv("TILE_DEBUG", "0")  # (set at all: the Python path reads it)
        assert fn((x, y)) is None
    lane = hot.lane.lane
    with lane.program._lock:  # (a general call of the program running on another thread)
        assert fn((x, y)) is None
    with monkeypatch.context() as m:
        m.setattr(lane.executor, "_queued", 1)  # (general work queued)
        assert fn((x, y)) is None
    with monkeypatch.context() as m:
        m.setattr(lane.program, "_last", [object()])  # (a general call's events not waited for)
        assert fn((x, y)) is None
    with torch.inference_mode():  # (no gradient: the plain call, as the Python path's)
        z = add(x, y)
    assert torch.equal(z, x + y) and z.is_inference()
    assert torch.equal(fn((x, y)), x + y)


def test_the_compiled_call_keeps_no_reference():
    """Every path through the builtin (taken, declined, declined by an error, a gradient) gives
    back each reference it took."""
    add, fn, hot = _compiled("compiled_references")
    alone = _alone(hot)
    x, y, xg, yg = ints(3), ints(3, seed=1), ints(3, seed=2).requires_grad_(), ints(3).requires_grad_()
    sparse, neg = y.to_sparse(), torch._neg_view(y)
    watched = (x, y, xg, yg, sparse, neg, None, True, False, 0, -1, torch.float32, hot, torch.empty_like)

    def calls():
        for f in (fn, alone):
            f((x, y)), f((x, sparse)), f((x, neg)), f((x, x)), f((xg, y)), f((xg, yg)), f((x,))

    for _ in range(50):  # (warm: caches filled)
        calls()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(500):
        calls()
    after = [sys.getrefcount(o) for o in watched]
    assert after == before


def test_torch_compile_traces_past_a_compiled_call():
    """Dynamo sees the op's call, not the builtin (which it cannot trace): one graph, no break."""
    add, fn, _ = _compiled("compiled_dynamo")
    x, y = ints(3), ints(3, seed=1)
    f = torch.compile(lambda a, b: add(a, b).sum() * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x, y), (x + y).sum() * 2)


def test_threads_with_general_calls_beside_get_their_own_results():
    """Threads calling the compiled call while others run the program's general path (one tensor
    twice: copied, the program's lock held while its kernels run without the GIL)."""
    add, fn, _ = _compiled("compiled_threads", 64)
    wrong = []

    def work(seed):
        for i in range(200):
            x, y = ints(64, seed=seed), torch.full((64,), float(i))
            z = add(x, x) if seed % 2 else add(x, y)
            if not torch.equal(z, x + x if seed % 2 else x + y):
                wrong.append((seed, i))

    in_threads(work)
    assert not wrong


def test_each_tensors_checks_are_the_python_paths():
    """What each tensor is read for: the Python path's checks, one for one (a check that no CPU
    tensor here can fail, the device, is seen in the plan; the CUDA test below fails it)."""
    _, _, hot = _compiled("compiled_plan")
    names = {}
    for check in hot.entry.plan.before:
        place = getattr(check.obj, "place", None)
        if place is not None:
            names.setdefault(place, []).append(getattr(check.key, "__name__", check.key))
    want = ["is_cpu", "dtype", "shape", "is_contiguous", "is_neg", "data_ptr"]
    guards = hot.entry.plan.guards
    if guards is not None:  # (all but the address in one check: the Dynamo guard's)
        want = want[-1:]
        assert [g.read for g in guards] == ["applied", "applied"]
    assert names == {0: want, 1: want}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (off the CPU, with memory)")
def test_a_cuda_tensor_at_a_cpu_signature_declines():
    add, _, hot = _compiled("compiled_cuda")
    fn = _alone(hot)
    x, y = ints(3), ints(3, seed=1)
    assert fn((x, y.cuda())) is None and fn((x.cuda(), y.cuda())) is None
    with pytest.raises((RuntimeError, TileError)):  # (two devices: an error, never a kernel on it)
        add(x, y.cuda())


@pytest.mark.parametrize("why", ["layout", "error"])
def test_where_no_call_can_be_compiled_the_python_call_stays(monkeypatch, why):
    """Another interpreter's layout (no entry), or an error building it (LLVM's): the Python hot
    call stays the op's, with its results."""
    import backends.llvm.callentry as callentry
    import tile.torch_hot as hot_module

    def fails(hot):
        raise RuntimeError("LLVM IR parsing error")

    if why == "layout":
        monkeypatch.setattr(callentry, "_layout_holds", lambda: False)
    else:
        monkeypatch.setattr(hot_module, "compiled_call", fails)
    add = tt.op(ADD, name=f"compiled_none_{why}_{hot_module.TENSOR_GUARDS}")
    x, y = ints(3), ints(3, seed=1)
    for _ in range(NATIVE_AFTER + 2):
        assert torch.equal(add(x, y), x + y)
    hot = add._lanes[signature((x, y))].hot
    assert hot.lane.lane._entry is not None and hot.entry is None
    assert add._hot is hot.call and type(hot.call).__name__ == "function"


@pytest.mark.parametrize("case", ["two outputs", "a reduction", "an integer output"])
def test_other_outputs_are_made_as_the_lane_makes_them(monkeypatch, case, tensor_checks):
    """Several outputs (a tuple), an output of its own shape (``torch.empty`` of it, or zeros where
    the program needs them), an integer one (not differentiable): compiled and taken, with the
    lane's results, each reference given back on every path."""
    import tile.torch_hot as hot_module

    source, shapes, want = {
        "two outputs": ("function (A[N], B[N]) -> (S, P) { S = A + B; P = A * B; }", ((5,), (5,)),
                        lambda a, b: (a + b, a * b)),
        "a reduction": ("function (A[N, M], B[N, M]) -> (O) { O[i: N] = +(A[i, j] * B[i, j]); }",
                        ((3, 4), (3, 4)), lambda a, b: (a * b).sum(1)),
        "an integer output": ("function (A[N], B[N]) -> (Y, I) { Y = A * B; I = as_int(A, 32); }",
                              ((4,), (4,)), lambda a, b: (a * b, a.int())),
    }[case]
    op = tt.op(source, name=f"compiled_outputs_{case.replace(' ', '_')}_{tensor_checks}")
    a, b = ints(*shapes[0]), ints(*shapes[1], seed=1)
    for _ in range(NATIVE_AFTER + 2):
        op(a, b)
    hot = op._lanes[signature((a, b))].hot
    assert hot.entry is not None and op._hot is hot.entry.fn and hot_module.TENSOR_GUARDS == (
        tensor_checks == "guards")
    alone = _alone(hot)

    def same(got, expected):
        got = got if isinstance(got, tuple) else (got,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        return len(got) == len(expected) and all(torch.equal(g, e) for g, e in zip(got, expected))

    with monkeypatch.context() as m:
        _refuse(m)
        for seed in range(3):
            a, b = ints(*shapes[0], seed=seed + 2), ints(*shapes[1], seed=seed + 5)
            assert same(alone((a, b)), want(a, b)) and same(op(a, b), want(a, b))
    ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = alone((ag, bg))
    first = out[0] if isinstance(out, tuple) else out
    assert type(first.grad_fn).__name__ == "TileHotFunctionBackward"
    if case == "an integer output":
        assert not out[1].requires_grad
    watched = (a, b, ag, bg, None, True, False, hot)
    program, events = hot.lane.lane.program, [object()]

    def calls():
        for f in (hot.entry.fn, alone):
            f((a, b)), f((a, a)), f((a, torch._neg_view(b))), f((ag, bg)), f((b,))
        last, program._last = program._last, events  # (declined after its outputs are made)
        assert alone((a, b)) is None
        program._last = last

    for _ in range(30):
        calls()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(300):
        calls()
    assert [sys.getrefcount(o) for o in watched] == before


def test_a_plan_reading_an_object_through_another_classs_function_is_refused():
    """A descriptor's C function reads its own class's objects: a plan that would call one on
    another type (here a tensor through ``int``'s getter) is refused when built, not run."""
    from backends.llvm.callentry import Arg, Check

    _, _, hot = _compiled("compiled_refused")
    plan = hot.entry.plan
    wrong = Check("get", Arg(0), int.__dict__["real"], "is", None)
    with pytest.raises(ValueError, match="not a descriptor of every type"):
        call_entry(dataclasses.replace(plan, before=(wrong, *plan.before)))
