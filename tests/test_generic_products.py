"""Shape-generic products on ``llvm_cpu.0`` (issue 40, ``backends.llvm.generic_tiles``): with the
``generic`` setting a product the micro-kernel takes is built once per bucket, its register tile
and K blocks fixed by the bucket, its row tiles, panels, edges and K blocks counted at run time.
Checked against the interpreter exactly on integer-valued inputs at many shapes (1, primes, tile
edges, a K past whole blocks, fewer rows than a tile), for the same bits at a length whichever
lengths built the template, in strict mode bit for bit against the specialized build, and through
``tile.torch`` forward and backward."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm import generic, generic_tiles
from bench.compile_time import ATTENTION, MATMUL
from tests.generic_support import assert_attention_close, fresh_registry, generic_info, ints  # noqa: F401

pytestmark = pytest.mark.usefixtures("private_cache")
OTHER_SPLIT = 1  # builds a product may take after its template: its other thread split
# builds the short lengths add (at most ``gemm_tile.GENERIC_FLAT_POINTS`` points: flat, plain loops
# with run-time extents, ``generic._short_flat``): their own template, the product and its zero fill
SHORT = 2
# the nest's M tile is the next power of two of M (``GemmModel.cpu_rule``): a bucket whose first two
# lengths share it widens its template once, when M passes it (a slot from then on)
WIDEN = 1

# 1, M < MR, primes, one past a panel (64 floats) and past a K block (128 points), two K blocks and
# a partial third, the panels' and rows' edges
SIZES = [100, 257, 1, 2, 3, 5, 7, 13, 31, 63, 64, 65, 97, 127, 128, 129, 161, 200, 255, 256, 321, 383]


def _product_forms() -> int:
    """Generic product forms built in this process (``generic_tiles`` buckets)."""
    return sum(1 for k, b in generic.REGISTRY.buckets.items() if k.startswith("tiles") and b.form)


def _products(exe, *args) -> int:
    """How many of the program's contractions run generic functions."""
    lib = exe.prepare(*args).library
    which = lib.extra["generic"]["which"]
    return sum(1 for j in which if "contraction" in getattr(lib.kernels[j].block, "tags", ()))


@pytest.mark.parametrize("shape", ["square", "rows", "depth"])
def test_integer_products_match_the_interpreter_with_one_build(shape):
    """M = N = K varying; only M varying (K, N fixed); only K varying (M, N fixed)."""
    exe = tile.compile(MATMUL, "llvm_cpu.0", {"generic": True, "cache": False})
    ref = tile.compile(MATMUL, "interp")
    generated = []
    for n in SIZES:
        m, k, nn = {"square": (n, n, n), "rows": (n, 72, 80), "depth": (45, n, 70)}[shape]
        a, b = ints((m, k), n), ints((k, nn), n + 1)
        np.testing.assert_array_equal(exe(a, b)["C"], ref(a, b)["C"], err_msg=f"{shape} at {n}")
        generated.append(generic.REGISTRY.generated)
    # the first length is specialized, the second builds the templates (the product and its zero
    # fill); lengths of 1 (a dimension dropped) are other kernels, built specialized; the product
    # under its other thread split (rows or panels) is built when a length's schedule asks for it;
    # the short lengths make a plain-loop template of their own
    assert generated[0] == 0 and generated[1] >= 1
    assert generated[-1] - generated[1] <= OTHER_SPLIT + SHORT, f"later lengths generated code: {generated}"
    assert _products(exe, a, b) == 1 and generic_info(exe, a, b)["built"] == 0


def test_a_product_gives_the_same_bits_whichever_lengths_built_it():
    rng = np.random.default_rng(1)
    x = {n: (rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32))
         for n in (40, 50, 150, 151, 300, 333)}
    runs = []
    for order in ((40, 50, 300, 333), (150, 151, 300, 333)):
        generic.REGISTRY.clear()
        exe = tile.compile(MATMUL, "llvm_cpu.0", {"generic": True, "cache": False})
        runs.append([exe(*x[n])["C"] for n in order][2:])
        assert _products(exe, *x[333]) == 1
    for got, want in zip(*runs):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_float_products_within_the_reduction_bound():
    exe = tile.compile(MATMUL, "llvm_cpu.0", {"generic": True, "cache": False})
    rng = np.random.default_rng(2)
    for n in (30, 40, 3, 129, 300, 517):
        a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
        want = a.astype(np.float64) @ b
        bound = 2 * n * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))  # §8.3
        assert np.all(np.abs(exe(a, b)["C"] - want) <= bound), f"n={n}"
    assert _products(exe, a, b) == 1


def test_strict_generic_products_are_bit_identical_to_specialized():
    """Strict: no fused multiply-add, each element summed in order: the K blocks and tiles change
    nothing."""
    gen = tile.compile(MATMUL, "llvm_cpu.0", {"generic": True, "strict": True, "cache": False})
    spec = tile.compile(MATMUL, "llvm_cpu.0", {"strict": True, "cache": False})
    rng = np.random.default_rng(3)
    for n in (20, 24, 2, 65, 130, 257):
        a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
        np.testing.assert_array_equal(gen(a, b)["C"].view(np.uint32), spec(a, b)["C"].view(np.uint32))
    assert _products(gen, a, b) == 1


def test_transposed_operand_is_packed_from_run_time_strides():
    """``A @ B.T``: B is read along the vector index at a run-time stride (gathered into packed
    panels); float64 too."""
    src = "function (A[M, K], B[N, K]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[n, k]); }"
    ref = tile.compile(src, "interp")
    for dt in (np.float32, np.float64):
        generic.REGISTRY.clear()
        exe = tile.compile(src, "llvm_cpu.0", {"generic": True, "cache": False})
        for n in (40, 41, 3, 17, 66, 130, 200):
            a, b = ints((n, n + 3), n).astype(dt), ints((n, n + 3), n + 1).astype(dt)
            np.testing.assert_array_equal(exe(a, b)["C"], ref(a, b)["C"], err_msg=f"{dt} at {n}")
        assert _products(exe, a, b) == 1 and generic_info(exe, a, b)["built"] == 0


def test_attention_products_are_generic_and_exact():
    """Q K^T (M = N = S, K the head size) and P V (M = K = S, N the head size), with the softmax
    between them: every kernel generic after two lengths (past the short ones, which stay flat),
    on inputs whose products are exact."""
    exe = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True, "cache": False})
    counts = []
    for n in (72, 80, 96, 101, 128, 200, 257):
        rng = np.random.default_rng(n)
        q, k, v = (rng.integers(-2, 3, size=(n, 8)).astype(np.float32) for _ in range(3))
        r = rng.integers(-2, 3, size=(n, n)).astype(np.float32)
        assert_attention_close(exe(q, k, r, v)["O"], q, k, r, v)
        counts.append(generic.REGISTRY.generated)
    assert counts[-1] - counts[1] <= 2 * OTHER_SPLIT + WIDEN, f"a later length generated code: {counts}"
    assert _products(exe, q, k, r, v) == 2


def test_signature_fixes_the_structure_not_the_sizes():
    a = tile.compile(MATMUL, "llvm_cpu.0", {"cache": False})
    blocks = {}
    for n in (70, 90):
        x = np.ones((n, n), np.float32)
        lib = a.prepare(x, x).library
        blocks[n] = next(k.block for k in lib.kernels if "contraction" in k.block.tags)
    from backends.llvm.match import from_nest

    flat = {n: (from_nest(b) or (b,))[0] for n, b in blocks.items()}
    s70, s90 = (generic_tiles.signature(flat[n], {}, 0) for n in (70, 90))
    assert s70 is not None and s70[1] == s90[1]
    assert generic_tiles.signature(flat[70], {}, 0, fill=70 * 70)[1][-1] is True  # covers its output
    assert generic_tiles.signature(flat[70], {}, 0, fill=71 * 70)[1][-1] is False


def test_torch_dynamic_products_forward_and_backward():
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt

    op = tt.op(MATMUL, name="generic_products_matmul", dynamic=True, settings={"cache": False})
    counts = []
    for n in (40, 50, 3, 17, 64, 65, 129, 200, 131):
        a = torch.randint(-3, 4, (n, n + 1), dtype=torch.float32, requires_grad=True)
        b = torch.randint(-3, 4, (n + 1, n), dtype=torch.float32, requires_grad=True)
        c = op(a, b)
        g = torch.randint(-2, 3, c.shape, dtype=torch.float32)
        (c * g).sum().backward()
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        c2 = a2 @ b2
        (c2 * g).sum().backward()
        for got, want in ((c, c2), (a.grad, a2.grad), (b.grad, b2.grad)):  # integers: exact
            torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
        counts.append(generic.REGISTRY.generated)
    assert counts[-1] - counts[3] <= 3 * OTHER_SPLIT, f"lengths after the first few generated code: {counts}"
    assert _product_forms() >= 2, "the forward's product and the backward's two are generic"


@pytest.mark.parametrize(
    "src, shapes",
    [
        ("function (A[B, M, K], C[B, K, N]) -> (O) { O[b, m, n: B, M, N] = +(A[b, m, k] * C[b, k, n]); }",
         lambda n: [(3, n, n), (3, n, n)]),
        ("function (A[M, K], C[K, N]) -> (O) { O[m, n: M, N] = >(A[m, k] + C[k, n]); }",
         lambda n: [(n, n), (n, n)]),
        # a guard on the row index: B is not packed, a run-time K sums in chunks (a deep cascade)
        ("function (A[M, K], C[K, N]) -> (O) { O[m, n: M, N] = +(A[m, k] * C[k, n]), m - k < M; }",
         lambda n: [(n, n), (n, n)]),
    ],
    ids=["batched", "max-plus", "guarded"],
)
def test_other_products_generic_and_exact(src, shapes):
    exe = tile.compile(src, "llvm_cpu.0", {"generic": True, "cache": False})
    ref = tile.compile(src, "interp")
    generated = []
    for n in (40, 50, 3, 17, 64, 65, 130, 301):
        args = [ints(s, n + i) for i, s in enumerate(shapes(n))]
        np.testing.assert_array_equal(exe(*args)["O"], ref(*args)["O"], err_msg=f"at {n}")
        generated.append(generic.REGISTRY.generated)
    assert generated[-1] - generated[1] <= OTHER_SPLIT + SHORT and _products(exe, *args) == 1


def _attention_inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.integers(-2, 3, size=s).astype(np.float32) for s in [(n, 8), (n, 8), (n, n), (n, 8)]]


def test_a_generic_library_is_stored_and_restored_by_the_program_cache():
    """``snapshot`` names each generic function's module (its object-cache key), symbol and
    extents; a new process (here: the registry and loaded modules forgotten) restores the
    library from the program cache with no code generated, and its results are the same bits."""
    from backends import registry

    device = registry.get("llvm_cpu.0")
    exe = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True})
    for n in (70, 80):  # past the short lengths (their kernels' first is built specialized)
        exe(*_attention_inputs(n))
    ins = _attention_inputs(90)
    want = exe(*ins)["O"]
    cp = exe.prepare(*ins)
    assert cp.library.extra["generic"]["kernels"] == len(cp.infos)  # every kernel generic
    snap = device.compiler.snapshot(cp.library)
    assert snap["own"] is False and len(snap["generic"]) == len(cp.infos)
    generic.REGISTRY.clear()
    generic.LOADED.clear()
    assert device.compiler.restore(cp.infos, {"generic": True}, snap) is not None
    assert device.compiler.restore(cp.infos, {"generic": True}, {"generic": True}) is None  # an old one
    again = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True})
    got = again(*ins)["O"]
    assert again._last.library.extra["program_cache"] == "hit"
    assert generic.REGISTRY.generated == 0 and generic.REGISTRY.buckets == {}
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _has_run_time_local(block) -> bool:
    from backends.llvm.symbolic import is_slot
    from stripe.ir import Block, RefDir

    if not isinstance(block, Block):
        return False
    local = any(r.dir is RefDir.NONE and r.from_ is None and any(is_slot(d.size) for d in r.shape.dims)
                for r in block.refs)
    return local or any(_has_run_time_local(s) for s in block.stmts)


def test_short_attention_lengths_with_run_time_locals():
    """Below 24 the optimizer's nest of the attention's Q K^T + R (here kept at short lengths: the
    config's ``flat_points`` -1) is not read back by the micro-kernel: a fused kernel whose
    accumulator local follows S. It is generic as plain loops with the local allocated at its
    run-time size (``codegen.run_time_local``), checked exactly against float64 numpy."""
    from dataclasses import replace

    from stripe.config import target_config

    cfg = target_config("llvm_cpu")
    cfg = replace(cfg, passes=tuple(replace(s, params=replace(s.params, flat_points=-1))
                                    if s.pass_ == "gemm_tile" else s for s in cfg.passes))
    exe = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True, "cache": False, "config": cfg})
    lengths = list(range(4, 24))
    made = []
    for n in lengths:
        q, k, r, v = _attention_inputs(n)
        assert_attention_close(exe(q, k, r, v)["O"], q, k, r, v)
        lib = exe._last.library
        fused = next(j for j, info in enumerate(lib.kernels) if "fused" in info.block.tags)
        made.append(lib.extra["generic"]["which"].get(fused, True))
    assert sum(made) <= 8, f"the fused kernel generated code at {sum(made)} of {len(lengths)} lengths"
    forms = [b.form.template for b in generic.REGISTRY.buckets.values() if b.form is not None]
    assert any(_has_run_time_local(t) for t in forms)


def test_generic_products_on_the_lane():
    """Repeated calls at one length run on ``tile.torch``'s lane (its native call after 8 runs),
    which passes each generic kernel its extents after its buffers: still exact."""
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt

    op = tt.op(MATMUL, name="generic_products_lane", dynamic=True, settings={"cache": False})
    for n in (40, 50, 77):
        for _ in range(12):
            a = torch.randint(-3, 4, (n, n + 1), dtype=torch.float32, requires_grad=True)
            b = torch.randint(-3, 4, (n + 1, n), dtype=torch.float32, requires_grad=True)
            c = op(a, b)
            c.sum().backward()
            torch.testing.assert_close(c.detach(), a.detach() @ b.detach(), rtol=0, atol=0)
            torch.testing.assert_close(b.grad, a.detach().T @ torch.ones(n, n), rtol=0, atol=0)
    assert _product_forms() >= 1
