"""tile.jax: a Tile function as a JAX function (custom_vjp over pure_callback) under ``jax.jit``,
``jax.grad`` and ``jax.vmap`` (a sequential batch loop), and a 2-layer MLP trained through it whose
losses match the same model in pure JAX."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry

jax = pytest.importorskip("jax", reason="tile.jax needs JAX (pip install -e '.[jax]')")
tj = pytest.importorskip("tile.jax", reason="tile.jax needs JAX")
jnp = jax.numpy

pytestmark = pytest.mark.skipif(
    "llvm_cpu.0" not in registry.devices(), reason="tile.jax runs on llvm_cpu.0"
)

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
MLP_LOSS = """function (X[N, D], Y[N, K], W1[D, H], B1[H], W2[H, K], B2[K]) -> (L) {
    Z1[n, h: N, H] = +(X[n, d] * W1[d, h]);
    A1 = relu(Z1 + B1);
    Z2[n, k: N, K] = +(A1[n, h] * W2[h, k]);
    E = Z2 + B2 - Y;
    S[] = +(E[n, k] * E[n, k]);
    L = S / (N * K);
}"""


def ints(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(-4, 5, shape).astype(np.float32))


def test_values_jit_and_errors():
    mm = tj.op(MATMUL)
    a, b = ints(3, 5), ints(5, 4, seed=1)
    assert np.array_equal(mm(a, b), a @ b)
    assert np.array_equal(jax.jit(lambda a, b: mm(a, b) * 2)(a, b), (a @ b) * 2)
    with pytest.raises(tile.TileInputError, match=r"A float32\[3, 5\], B float32\[4, 4\].*dimension 'L'"):
        mm(a, jnp.ones((4, 4)))
    with pytest.raises(tile.TileInputError, match=r"takes 2 tensor\(s\)"):
        mm(a)


def test_grad_matches_jax():
    mm = tj.op(MATMUL)
    a, b = ints(3, 5) / 4, ints(5, 2, seed=1) / 4

    def loss(f):
        return lambda a, b: jnp.sum(jnp.tanh(f(a, b)))

    got = jax.grad(loss(mm), argnums=(0, 1))(a, b)
    want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(a, b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # under jit too, and only one argument
    g = jax.jit(jax.grad(loss(mm)))(a, b)
    np.testing.assert_allclose(g, want[0], rtol=1e-5, atol=1e-6)


def test_vmap_is_a_batch_loop():
    mm = tj.op(MATMUL)
    a, b = ints(6, 2, 3), ints(3, 4, seed=1)
    assert np.array_equal(jax.vmap(mm, in_axes=(0, None))(a, b), jnp.einsum("bij,jk->bik", a, b))
    assert np.array_equal(jax.jit(jax.vmap(mm))(a, jnp.stack([b] * 6)), jnp.einsum("bij,jk->bik", a, b))
    per = jax.vmap(jax.grad(lambda a, b: jnp.sum(mm(a, b) ** 2)), in_axes=(0, None))(a, b)
    want = jax.vmap(jax.grad(lambda a, b: jnp.sum((a @ b) ** 2)), in_axes=(0, None))(a, b)
    np.testing.assert_allclose(per, want, rtol=1e-6)
    assert len(mm.core._runs) == 1  # compiled once, for the element shapes


def test_int_inputs_get_no_gradient():
    gather = tj.op("function (T[N], I[M]) -> (O) { O = gather(T, I); }")
    t, idx = jnp.arange(5.0), jnp.array([4, 0, 0], dtype=jnp.int32)
    assert np.array_equal(gather(t, idx), t[idx])
    g = jax.grad(lambda t: jnp.sum(gather(t, idx)))(t)
    assert np.array_equal(g, np.array([2.0, 0, 0, 0, 1]))


def test_two_layer_mlp_trains_and_matches_pure_jax():
    """40 SGD steps of an MLP whose whole loss is one Tile function, against the same in JAX."""
    rng = np.random.default_rng(0)
    n, d, h, k = 16, 4, 8, 2
    x = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))
    y = jnp.asarray(np.stack([x[:, 0] * x[:, 1], x[:, 2] - x[:, 3]], 1))
    params = [jnp.asarray(rng.normal(size=s).astype(np.float32) * 0.5) for s in ((d, h), (h,), (h, k), (k,))]
    tile_loss = tj.op(MLP_LOSS)

    def jax_loss(x, y, w1, b1, w2, b2):
        return jnp.mean((jax.nn.relu(x @ w1 + b1) @ w2 + b2 - y) ** 2)

    def train(loss):
        step = jax.jit(jax.value_and_grad(lambda p: loss(x, y, *p)))
        p, losses = list(params), []
        for _ in range(40):
            value, grads = step(p)
            losses.append(float(value))
            p = [w - 0.05 * g for w, g in zip(p, grads)]
        return np.array(losses)

    got, want = train(tile_loss), train(jax_loss)
    assert got[-1] < 0.5 * got[0]
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_higher_derivatives_differentiate_the_gradient_program():
    """The VJP runs Tile's gradient program as a tile.jax op of its own, so reverse-over-reverse
    works to any order (forward mode, jax.jvp / jax.hessian, does not: custom_vjp)."""
    f = tj.op("function (X[N]) -> (Y) { Y = tanh(X) * X; }")

    def third(fn):
        return jax.jit(jax.vmap(jax.grad(jax.grad(jax.grad(lambda v: fn(v[None])[0])))))

    x = jnp.linspace(-1.0, 1.0, 5)
    np.testing.assert_allclose(third(f)(x), third(lambda v: jnp.tanh(v) * v)(x), rtol=1e-5, atol=1e-6)
    hess = jax.jacrev(jax.jacrev(lambda v: jnp.sum(f(v))))(x)
    np.testing.assert_allclose(hess, jax.hessian(lambda v: jnp.sum(jnp.tanh(v) * v))(x), rtol=1e-5, atol=1e-6)


def test_none_input_pickling_and_forward_mode_refused_clearly():
    """A None input is a TileInputError naming it; an op pickles as its definition; forward mode
    through the custom_vjp is JAX's own clear refusal, never a silent zero."""
    import pickle

    mm = tj.op(MATMUL)
    with pytest.raises(tile.TileInputError, match="input 'A' is None, not an array"):
        mm(None, jnp.ones((3, 4)))
    again = pickle.loads(pickle.dumps(mm))
    a, b = jnp.arange(6.0).reshape(2, 3), jnp.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(again(a, b)), np.asarray(a) @ np.asarray(b))
    with pytest.raises(TypeError, match="forward-mode autodiff"):
        jax.jvp(lambda a: mm(a, b), (a,), (jnp.ones_like(a),))
