"""A ``tile.torch`` op with ``dynamic=True`` at many new short lengths (issue 40's cold forward +
backward): which lengths generate code, and that the results stay right.

The relative-bias attention (``bench.compile_time.ATTENTION``) at S = 1..12: its backward's
``dO V^T`` is an optimizer nest the micro-kernel refuses at these lengths (``generic._refused_nest``:
generic plain loops, not a specialized build per length), and its short products run under their
bucket's thread split (``generic.SMALL_SPLIT``: no second function for the other split). A short
product built specialized (its bucket's first kernel) is built as plain loops
(``generic.SMALL_FIRST``), not as the micro-kernel's thousands of IR lines."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm import device, generic
from bench.compile_time import ATTENTION, MATMUL
from tests.generic_support import fresh_registry  # noqa: F401

pytestmark = pytest.mark.usefixtures("private_cache")


QUIET = (7, 10, 11, 12)  # lengths where no kernel changes structure (the fused Q K^T + R is a
# one-off nest at S = 5 and 8, and its un-nested form changes at S = 4, 6 and 9)


def _attention(torch, n: int):
    g = torch.Generator().manual_seed(n)
    shapes = [(n, 8), (n, 8), (n, n), (n, 8)]
    return [torch.randint(-2, 3, s, generator=g, dtype=torch.float32).requires_grad_() for s in shapes]


def _check(torch, args, y) -> None:
    """Forward and gradients against PyTorch's, within 4 (S + 8) eps max|x| (a softmax's sums)."""
    ref = [a.detach().clone().requires_grad_() for a in args]
    q, k, r, v = ref
    want = torch.softmax(q @ k.T + r, dim=1) @ v
    want.sum().backward()
    eps = torch.finfo(torch.float32).eps
    for got, w in [(y.detach(), want.detach())] + [(a.grad, b.grad) for a, b in zip(args, ref)]:
        tol = 4 * (len(q) + 8) * eps * max(1.0, float(w.abs().max()))
        torch.testing.assert_close(got, w, rtol=0, atol=tol)


def test_short_lengths_generate_no_specialized_code_once_generic(monkeypatch):
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt

    made: dict[int, int] = {}
    n_now = [0]
    real = device.generate

    def counted(*args, **kwargs):
        made[n_now[0]] = made.get(n_now[0], 0) + 1
        return real(*args, **kwargs)

    monkeypatch.setattr(device, "generate", counted)
    op = tt.op(ATTENTION, name="generic_cold_attention", dynamic=True, settings={"cache": False})
    for n in range(1, 13):
        n_now[0] = n
        args = _attention(torch, n)
        y = op(*args)
        y.sum().backward()
        _check(torch, args, y)
    assert not [n for n in QUIET if made.get(n)], f"specialized modules generated per length: {made}"


def test_short_products_run_under_their_buckets_thread_split():
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt

    op = tt.op(ATTENTION, name="generic_cold_split", dynamic=True, settings={"cache": False})
    for n in range(1, 13):
        args = _attention(torch, n)
        y = op(*args)
        y.sum().backward()
        _check(torch, args, y)
    forms = [b.form for k, b in generic.REGISTRY.buckets.items() if k.startswith("tiles") and b.form]
    assert forms, "the attention's products are generic"
    assert not [f.other for f in forms if f.other], "a short product built its other thread split"


def test_a_short_first_product_is_built_as_plain_loops():
    ref = tile.compile(MATMUL, "interp")
    rng = np.random.default_rng(0)
    sources = {}
    for gen in (False, True):
        exe = tile.compile(MATMUL, "llvm_cpu.0", {"generic": gen, "cache": False})
        for n in (20, 21, 27):
            a, b = (rng.integers(-3, 4, size=(n, n)).astype(np.float32) for _ in range(2))
            np.testing.assert_array_equal(exe(a, b)["C"], ref(a, b)["C"], err_msg=f"generic={gen} at {n}")
            sources[gen, n] = exe.prepare(a, b).library.source
    first, specialized = sources[True, 20].count("\n"), sources[False, 20].count("\n")
    assert first * 3 < specialized, f"the first 20^3 product: {first} IR lines, specialized {specialized}"
    assert sources[True, 27] == "", "a later length binds the generic product (no module of its own)"
