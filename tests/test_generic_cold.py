"""A ``tile.torch`` op with ``dynamic=True`` at many new short lengths (issue 40's cold forward +
backward): which lengths generate code, and that the results stay right.

The relative-bias attention (``bench.compile_time.ATTENTION``) at S = 1..16: its GEMMs of at most
``gemm_tile.GENERIC_FLAT_POINTS`` points stay flat (no optimizer nest, whose tiles follow S) and
run as generic plain loops (``generic._short_flat``), so S = 6..16 generate no code
(the fused Q K^T + R made a new template at S = 6, 9 and 16 before, its backward's ``dO V^T`` a
specialized build at every length before ``generic._refused_nest``). A short product built
specialized (its bucket's first kernel) is built as plain loops (``generic.SMALL_FIRST``), not as
the micro-kernel's thousands of IR lines."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm import device, generic
from bench.compile_time import ATTENTION, MATMUL
from tests.generic_support import assert_attention_close, fresh_registry, ints  # noqa: F401

pytestmark = pytest.mark.usefixtures("private_cache")


QUIET = range(6, 17)  # lengths that generate no code: every kernel binds a template of S <= 5 (two
# kernels of the backward change structure at S = 17: a new bucket, its template at 18)


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


def test_short_lengths_generate_no_code_once_generic(monkeypatch):
    """Neither a specialized module (``device.generate``) nor a generic template (``generic``'s
    count) at any length of ``QUIET``."""
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
    for n in range(1, QUIET[-1] + 1):
        n_now[0] = n
        before = generic.REGISTRY.generated
        args = _attention(torch, n)
        y = op(*args)
        y.sum().backward()
        _check(torch, args, y)
        made[n] = made.get(n, 0) + generic.REGISTRY.generated - before
    assert not [n for n in QUIET if made.get(n)], f"code generated per length: {made}"


def test_short_products_are_generic_plain_loops():
    """At S = 1..12 both contractions of the attention run generic functions, plain loops (no
    micro-kernel product template is built for them), equal to float64 numpy within the bound."""
    exe = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True, "cache": False})
    for n in range(1, 13):
        q, k, v = (ints((n, 8), n + i) for i in range(3))
        r = ints((n, n), n + 3)
        assert_attention_close(exe(q, k, r, v)["O"], q, k, r, v)
    lib = exe._last.library
    products = [j for j, info in enumerate(lib.kernels) if "contraction" in info.block.tags]
    assert len(products) == 2 and all(j in lib.extra["generic"]["which"] for j in products)
    # (a short product may be its product bucket's first kernel, ``generic._remember_short``: no build)
    templates = [k for k, b in generic.REGISTRY.buckets.items() if k.startswith("tiles") and b.form]
    assert not templates, "a micro-kernel template"


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


def test_a_first_product_built_as_plain_loops_is_built_at_first_opt():
    """Past the short lengths (40^3: 64k points, an optimizer nest) the bucket's first product is
    still plain loops (``generic.SMALL_FIRST``), in a module at ``device.FIRST_OPT`` without
    unrolling, where the specialized build of that length is at -O3."""
    ref = tile.compile(MATMUL, "interp")
    rng = np.random.default_rng(1)
    opts = {}
    for gen in (False, True):
        exe = tile.compile(MATMUL, "llvm_cpu.0", {"generic": gen, "cache": False})
        for n in (40, 41):
            a, b = (rng.integers(-3, 4, size=(n, n)).astype(np.float32) for _ in range(2))
            np.testing.assert_array_equal(exe(a, b)["C"], ref(a, b)["C"], err_msg=f"generic={gen} at {n}")
            opts[gen, n] = exe.prepare(a, b).library.extra["opt"]
    assert opts[True, 40] <= device.FIRST_OPT < opts[False, 40], f"LLVM levels (generic, n): {opts}"
