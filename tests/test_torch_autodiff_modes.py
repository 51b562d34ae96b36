"""tile.torch in every autodiff mode (issue 37): forward-mode dual numbers, ``torch.func``'s
``grad``, ``jacrev``, ``jvp``, ``jacfwd``, ``hessian`` and ``vmap`` of a gradient, checked against
float64 central finite differences and against the same function written in torch; a program
whose gradient cannot be derived refused when the op is made.
"""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch (pip install -e '.[torch]')")
tt = pytest.importorskip("tile.torch", reason="tile.torch needs PyTorch")
fwAD = torch.autograd.forward_ad

pytestmark = pytest.mark.skipif(
    "llvm_cpu.0" not in registry.devices(), reason="tile.torch runs CPU tensors on llvm_cpu.0"
)

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
TWO = """function (X[N, C], W[C]) -> (Y, S) {
    Y = tanh(X * W);
    S[n: N] = +(X[n, c] * X[n, c]);
}"""
TANH_X = "function (X[N]) -> (Y) { Y = tanh(X) * X; }"
GATHER = "function (T[N], I[M]) -> (O) { O = gather(T, I) * gather(T, I); }"
# a '*' aggregation of a combination of two tensors (its gradient goes through a term tensor)
PROD2 = "function (A[N, M], B[N, M]) -> (O) { O[i: N] = *(A[i, j] * B[i, j]); }"

EPS = float(np.finfo(np.float64).eps)
H = 1e-5  # the finite-difference step: truncation ~H^2 |f'''|, rounding ~EPS |f| / H


def f64(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def central(fn, xs, vs):
    """The directional derivative of ``fn`` at ``xs`` along ``vs``: float64 central differences."""
    plus = fn(*(x + H * v for x, v in zip(xs, vs)))
    minus = fn(*(x - H * v for x, v in zip(xs, vs)))
    if isinstance(plus, tuple):
        return tuple((p - m) / (2 * H) for p, m in zip(plus, minus))
    return (plus - minus) / (2 * H)


def close_to_differences(got, want, terms: int, scale: float):
    """Within finite differences' error: truncation plus rounding, growing with the number of
    terms each output sums (``terms``) and the values' size (``scale``)."""
    tol = 10 * (H * H * scale**3 + terms * EPS * scale**2 / H)
    assert torch.allclose(got, want, rtol=0, atol=tol), (got - want).abs().max()


def test_forward_ad_dual_numbers_carry_tangents():
    """``torch.autograd.forward_ad``: the tangent of each output (was silently None)."""
    mm = tt.op(MATMUL, name="m_matmul")
    two = tt.op(TWO, name="m_two")
    a, b, va, vb = f64(2, 3), f64(3, 4, seed=1), f64(2, 3, seed=2), f64(3, 4, seed=3)
    x, w, vx, vw = f64(4, 3, seed=4), f64(3, seed=5), f64(4, 3, seed=6), f64(3, seed=7)
    with fwAD.dual_level():
        c = fwAD.unpack_dual(mm(fwAD.make_dual(a, va), fwAD.make_dual(b, vb)))
        y, s = (fwAD.unpack_dual(t) for t in two(fwAD.make_dual(x, vx), fwAD.make_dual(w, vw)))
        via_operator = fwAD.unpack_dual(mm.op(fwAD.make_dual(a, va), b))  # torch.ops.tile too
    assert c.tangent is not None and torch.allclose(c.tangent, va @ b + a @ vb, rtol=1e-13, atol=1e-13)
    close_to_differences(c.tangent, central(mm, (a, b), (va, vb)), 3, 3.0)
    dy, ds = central(two, (x, w), (vx, vw))
    close_to_differences(y.tangent, dy, 2, 3.0)
    close_to_differences(s.tangent, ds, 3, 3.0)
    assert torch.allclose(via_operator.tangent, va @ b, rtol=1e-13, atol=1e-13)


def test_torch_func_jvp_and_jacfwd_match_differences_and_reverse_mode():
    f = tt.op(TANH_X, name="m_tanh_x")
    mm = tt.op(MATMUL, name="m_matmul")
    x, v = f64(5), f64(5, seed=1)
    out, tangent = torch.func.jvp(f, (x,), (v,))
    assert torch.equal(out, f(x))
    close_to_differences(tangent, central(f, (x,), (v,)), 2, 3.0)
    a, b = f64(2, 3), f64(3, 4, seed=1)
    fwd = torch.func.jacfwd(mm, argnums=(0, 1))(a, b)
    rev = torch.func.jacrev(mm, argnums=(0, 1))(a, b)
    want = torch.func.jacrev(torch.matmul, argnums=(0, 1))(a, b)
    for got_f, got_r, w in zip(fwd, rev, want):
        assert torch.allclose(got_f, w, rtol=1e-13, atol=1e-13)
        assert torch.allclose(got_r, w, rtol=1e-13, atol=1e-13)
    jac = torch.func.jacfwd(f)(x)
    for k in range(5):  # each column: the derivative along a unit vector
        e = torch.zeros(5, dtype=torch.float64)
        e[k] = 1
        close_to_differences(jac[:, k], central(f, (x,), (e,)), 2, 3.0)


def test_torch_func_grad_and_hessian():
    f = tt.op(TANH_X, name="m_tanh_x")
    x = f64(5)
    g = torch.func.grad(lambda x: f(x).sum())(x)
    assert torch.allclose(g, torch.func.grad(lambda x: (torch.tanh(x) * x).sum())(x), rtol=1e-13, atol=1e-13)
    hess = torch.func.hessian(lambda x: f(x).sum())(x)  # jacfwd(jacrev): forward over reverse
    want = torch.func.hessian(lambda x: (torch.tanh(x) * x).sum())(x)
    assert torch.allclose(hess, want, rtol=1e-12, atol=1e-12)
    for k in range(5):  # the second derivative by differences of Tile's own gradient
        e = torch.zeros(5, dtype=torch.float64)
        e[k] = 1
        grad = torch.func.grad(lambda x: f(x).sum())
        close_to_differences(hess[:, k], central(grad, (x,), (e,)), 2, 3.0)
    rev_rev = torch.func.jacrev(torch.func.jacrev(lambda x: f(x).sum()))(x)
    fwd_fwd = torch.func.jacfwd(torch.func.jacfwd(lambda x: f(x).sum()))(x)
    assert torch.allclose(rev_rev, want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(fwd_fwd, want, rtol=1e-12, atol=1e-12)


def test_per_sample_gradients_vmap_of_grad():
    mm = tt.op(MATMUL, name="m_matmul")
    a, b = f64(6, 1, 3), f64(3, 2, seed=1)

    def loss(a, b):
        return torch.tanh(mm(a, b)).sum()

    got = torch.func.vmap(torch.func.grad(loss, argnums=1), in_dims=(0, None))(a, b)
    want = torch.func.vmap(torch.func.grad(lambda a, b: torch.tanh(a @ b).sum(), argnums=1),
                           in_dims=(0, None))(a, b)
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-13)


def test_an_integer_input_gets_no_tangent():
    gather = tt.op(GATHER, name="m_gather")
    t, v = f64(6), f64(6, seed=1)
    idx = torch.tensor([5, 0, 2, 2], dtype=torch.int32)
    _, tangent = torch.func.jvp(lambda t: gather(t, idx), (t,), (v,))
    assert torch.allclose(tangent, 2 * t[idx.long()] * v[idx.long()], rtol=1e-14, atol=1e-14)


def test_the_operator_itself_under_a_transform_is_refused():
    """``torch.ops.tile.<name>`` called inside ``torch.func.grad`` cannot reach Tile's derivatives
    (torch.func takes an autograd.Function only above its transforms): a clear error, not zeros."""
    mm = tt.op(MATMUL, name="m_matmul")
    a, b = f64(2, 3), f64(3, 4, seed=1)
    with pytest.raises(tile.TileInputError, match="called directly under a torch.func transform"):
        torch.func.grad(lambda a: mm.op(a, b).sum())(a)
    want = torch.ones(2, 4, dtype=torch.float64) @ b.T
    assert torch.allclose(torch.func.grad(lambda a: mm(a, b).sum())(a), want)


def test_an_underivable_gradient_is_refused_when_the_op_is_made(monkeypatch):
    """Tile derives a gradient for every program the language types (max, min and product
    aggregations over combinations were the last ones), so the refusal is checked through the
    derivation itself: where ``tile.autodiff.gradient`` refuses, making the op refuses, with the
    derivation's location and a way out, before any call."""
    import tile.autodiff

    def refuse(program, **kw):
        raise tile.TileTypeError("no derivative for this", program.stmts[0].span)

    monkeypatch.setattr(tile.autodiff, "gradient", refuse)
    with pytest.raises(tile.TileError, match="its gradient cannot be derived: no derivative") as e:
        tt.op(PROD2, name="m_underivable")
    assert "differentiable=False" in str(e.value)
    assert "m_underivable" not in tt._OPS  # nothing registered for a refused op
    monkeypatch.undo()
    assert tt.op(PROD2, name="m_underivable_ok") is not None  # the real derivation succeeds


def test_a_forward_only_op_refuses_its_backward():
    forward_only = tt.op(PROD2, name="m_prod2_fwd", differentiable=False)
    a, b = torch.arange(1.0, 7.0).reshape(2, 3), torch.full((2, 3), 2.0)
    assert torch.equal(forward_only(a, b), (a * b).prod(1))  # exact on integers
    with pytest.raises(tile.TileInputError, match="differentiable=False"):
        forward_only(a.requires_grad_(), b).sum().backward()
    with fwAD.dual_level(), pytest.raises(tile.TileInputError, match="differentiable=False"):
        forward_only(fwAD.make_dual(a.detach(), torch.ones(2, 3)), b)


def test_derivability_is_checked_when_made_or_at_the_first_call_of_each_dtype():
    """The source alone settles it where its inputs can be typed as float32: derived then. An
    integer index input cannot, so the first call of each dtype combination derives it, before the
    forward runs; a size the symbolic derivation cannot write (``N * N``) waits for shapes too."""
    made = tt.op(TANH_X, name="m_tanh_x")
    assert made.core._derivable is None  # settled when made
    gather = tt.op(GATHER, name="m_gather_first_call")
    assert gather.core._derivable == set()
    with torch.no_grad():
        gather(torch.ones(4), torch.tensor([0, 1], dtype=torch.int32))
    assert gather.core._derivable == {("float32", "int32")}
    spread = tt.op("function (I[N]) -> (O) { O[i: N * N] = +(I[i / N]); }", name="m_spread")
    assert spread.core._derivable == set()
    x = torch.arange(1.0, 4.0, dtype=torch.float64, requires_grad=True)
    out = spread(x)  # i / N is a whole index only where N divides i: [1, 0, 0, 2, 0, 0, 3, 0, 0]
    want = torch.zeros(9, dtype=torch.float64).index_put_((torch.arange(0, 9, 3),), x.detach())
    assert torch.equal(out, want)
    (out * torch.arange(9.0, dtype=torch.float64)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 3.0, 6.0], dtype=torch.float64))
