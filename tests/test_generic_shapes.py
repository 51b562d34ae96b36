"""Shape-generic kernels on ``llvm_cpu.0`` (issue 40, the ``generic`` setting, ``backends.llvm.generic``):
a kernel seen at a second length is built once with its differing integers read at run time; every
later length of its bucket binds with no code generated. Results are checked against the
interpreter at many lengths (1, bucket edges, primes): exactly on integer-valued inputs, and in
strict mode bit for bit against the specialized build on random floats."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import symbolic
from backends.llvm import generic
from stripe.ir import Block, Index
from tests.generic_support import assert_attention_close, fresh_registry, generic_info, ints  # noqa: F401

pytestmark = pytest.mark.usefixtures("private_cache")

# an elementwise chain and a row reduction along the varying dimension N
CHAIN = "function (A[N, D], B[N, D]) -> (C, S) { C = exp(A) * B + A; S[i: N] = +(C[i, d]); }"
INTS = "function (A[N, D], B[N, D]) -> (C, S) { C = A * B + A; S[i: N] = +(C[i, d]); T[d: D] = +(C[i, d]); }"
SOFTMAX = "function (X[N, M]) -> (P) { P = builtin_softmax(X, N, M); }"
LENGTHS = [5, 8, 1, 2, 3, 7, 9, 13, 16, 17, 31, 63, 64, 65, 97, 128, 257, 1000]


def test_matches_binds_from_the_flat_integers_as_bind_does():
    """``symbolic.matches`` on ``flat``'s lists gives what ``bind`` gives on the trees, for kernels
    of the template's erased text: the slots' integers, None for a fixed integer that differs or
    an integer of another type (a ``Fraction`` for an ``int``)."""
    from fractions import Fraction

    def block(n, d, e):
        return Block("k", idxs=(Index("i", n), Index("d", d), Index("e", e)))

    t = symbolic.unify(symbolic.unify(block(5, 8, 1), block(9, 8, 1)), block(9, 8, 2))
    assert symbolic.slots(t) == 2
    pattern = symbolic.flat(t)[1]
    for b in (block(123, 8, 1), block(123, 7, 1), block(4, 8, Fraction(3)), block(4, Fraction(8), 3)):
        text, ints = symbolic.flat(b)
        assert text == symbolic.erased(t)
        assert symbolic.matches(pattern, ints) == symbolic.bind(t, b)
    assert symbolic.matches(pattern, symbolic.flat(block(123, 8, 5))[1]) == [123, 5]
    assert symbolic.matches(pattern, symbolic.flat(block(123, 7, 5))[1]) is None  # fixed: 8
    assert symbolic.matches(pattern, symbolic.flat(block(4, Fraction(8), 3))[1]) is None  # its type


def test_slots_unify_bind_and_refuse_use():
    a = Block("k_5", idxs=(Index("i", 5), Index("d", 8)))
    b = Block("k_9", idxs=(Index("i", 9), Index("d", 8)))
    t = symbolic.unify(a, b)
    assert t is not None and symbolic.slots(t) == 1  # the names differ but are labels only
    assert symbolic.is_slot(t.idxs[0].range) and t.idxs[1].range == 8
    assert symbolic.bind(t, Block("x", idxs=(Index("i", 123), Index("d", 8)))) == [123]
    assert symbolic.bind(t, Block("x", idxs=(Index("i", 123), Index("d", 7)))) is None  # fixed: 8
    assert symbolic.bind(t, Block("x", idxs=(Index("j", 123), Index("d", 8)))) is None  # structure
    assert symbolic.erased(a) == symbolic.erased(b) == symbolic.erased(t)
    with pytest.raises(symbolic.SlotUsed):
        _ = t.idxs[0].range == 5
    with pytest.raises(symbolic.SlotUsed):
        range(t.idxs[0].range)


def test_integer_inputs_match_the_interpreter_at_every_length_with_two_builds():
    exe = tile.compile(INTS, "llvm_cpu.0", {"generic": True})
    ref = tile.compile(INTS, "interp")
    generated = []
    for n in LENGTHS:
        a, b = ints((n, 8), n), ints((n, 8), n + 1)
        got, want = exe(a, b), ref(a, b)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k} at N={n}")
        generated.append(generic.REGISTRY.generated)
    # the first length is specialized, the second builds the templates; lengths 1 and 2 are
    # optimized into other kernels (size-1 dimensions): at most a few more builds, then none
    assert generated[0] == 0 and generated[1] > 0
    assert generated[-1] == generated[len(LENGTHS) // 2], "later lengths generated code"
    info = generic_info(exe, ints((77, 8), 0), ints((77, 8), 1))
    assert info["kernels"] >= 2 and info["built"] == 0


@pytest.mark.parametrize("program", [CHAIN, SOFTMAX])
def test_strict_generic_is_bit_identical_to_specialized(program):
    gen = tile.compile(program, "llvm_cpu.0", {"generic": True, "strict": True})
    spec = tile.compile(program, "llvm_cpu.0", {"strict": True})
    rng = np.random.default_rng(3)
    for n in (6, 10, 1, 37, 128, 129):
        args = [rng.standard_normal((n, 8)).astype(np.float32)]
        if program == CHAIN:
            args.append(rng.standard_normal((n, 8)).astype(np.float32))
        got, want = gen(*args), spec(*args)
        for k in want:
            np.testing.assert_array_equal(got[k].view(np.uint32), want[k].view(np.uint32), err_msg=f"N={n}")
    assert generic_info(gen, *args)["kernels"] >= 1


def test_softmax_rows_generic_within_tolerance():
    exe = tile.compile(SOFTMAX, "llvm_cpu.0", {"generic": True})
    ref = tile.compile(SOFTMAX, "interp")
    rng = np.random.default_rng(5)
    for n, m in ((4, 9), (6, 9), (11, 9), (1, 9), (3, 9), (300, 9)):
        x = rng.standard_normal((n, m)).astype(np.float32)
        got, want = exe(x)["P"], ref(x)["P"]
        tol = 4 * (m + 2) * np.finfo(np.float32).eps  # exp within 1 ulp, a sum of m terms, a division
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert generic_info(exe, x)["kernels"] == 1


def test_a_length_gives_the_same_bits_whichever_lengths_built_the_template():
    x = {n: np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32) for n in (4, 6, 50, 51, 200)}
    runs = []
    for order in ((4, 6, 200), (50, 51, 200)):
        generic.REGISTRY.clear()
        exe = tile.compile(CHAIN, "llvm_cpu.0", {"generic": True, "cache": False})
        for n in order:
            out = exe(x[n], x[n])
        assert generic_info(exe, x[200], x[200])["kernels"] >= 1
        runs.append(out)
    for k in runs[0]:
        np.testing.assert_array_equal(runs[0][k].view(np.uint32), runs[1][k].view(np.uint32))


def test_gradient_at_many_lengths():
    program = tile.grad(CHAIN)
    exe = tile.compile(program, "llvm_cpu.0", {"generic": True})
    ref = tile.compile(program, "interp")
    parsed = tile.parse(program) if isinstance(program, str) else program
    for n in (3, 4, 1, 17, 64, 101):
        feed = {i.name: ints(tuple(n if d == "N" else 8 for d in i.dims), 7 * n + k) / 4
                for k, i in enumerate(parsed.inputs)}
        got, want = exe(feed), ref(feed)
        for k in want:  # exp of small integers: float32 rounding of a few terms per element
            tol = 16 * 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(want[k]).max()))
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=f"{k} at N={n}")
    assert generic_info(exe, {k: v for k, v in feed.items()})["kernels"] >= 1


def test_setting_off_builds_as_before():
    exe = tile.compile(CHAIN, "llvm_cpu.0")
    a = ints((9, 8), 1)
    exe(a, a)
    assert generic_info(exe, a, a)["kernels"] == 0
    assert generic.REGISTRY.buckets == {}


def test_torch_dynamic_op_builds_once_per_bucket_forward_and_backward():
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt

    program = "function (X[N, M], B[N, M]) -> (Y) { Z = X * B + X; Y = builtin_softmax(Z, N, M); }"
    op = tt.op(program, name="generic_shapes_softmax", dynamic=("N",), settings={"cache": False})
    assert op.core.settings["generic"] is True
    counts = []
    for n in (3, 5, 9, 1, 2, 17, 31, 64, 65, 129, 100):  # 1-3: other schedules (fewer rows than 2 threads)
        x = torch.randint(-2, 3, (n, 16), dtype=torch.float32, requires_grad=True)
        b = torch.randint(-2, 3, (n, 16), dtype=torch.float32, requires_grad=True)
        y = op(x, b)
        (y * y).sum().backward()
        x2, b2 = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        y2 = torch.softmax(x2 * b2 + x2, dim=1)
        (y2 * y2).sum().backward()
        tol = 8 * 16 * torch.finfo(torch.float32).eps  # exp within an ulp, rows of 16 terms
        for got, want in ((y, y2), (x.grad, x2.grad), (b.grad, b2.grad)):
            torch.testing.assert_close(got.detach(), want, rtol=tol, atol=tol)
        counts.append(generic.REGISTRY.generated)
    assert counts[-1] == counts[5], "lengths after the first few generated code"


def test_torch_dynamic_refuses_an_unknown_dimension():
    pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt
    from tile.errors import TileInputError

    with pytest.raises(TileInputError, match="not a dimension of its inputs"):
        tt.op("function (X[N]) -> (Y) { Y = X + 1; }", name="generic_shapes_bad", dynamic=("S",))


def test_attention_with_generic_products_builds_once():
    from bench.compile_time import ATTENTION

    settings = {"generic": True, "generic_products": True, "tiled": False}
    exe = tile.compile(ATTENTION, "llvm_cpu.0", settings)
    counts = []
    for n in (64, 72, 80, 96, 101, 128, 200):  # one schedule (rows >= 2 x threads), one bucket
        rng = np.random.default_rng(n)
        shapes = [(n, 8), (n, 8), (n, n), (n, 8)]
        q, k, r, v = (rng.integers(-2, 3, size=s).astype(np.float32) for s in shapes)
        assert_attention_close(exe(q, k, r, v)["O"], q, k, r, v)
        counts.append(generic.REGISTRY.generated)
    info = exe._last.library.extra["generic"]
    assert info["kernels"] == len(exe._last.library.kernels) and info["built"] == 0  # every kernel
    assert counts[-1] == counts[1], "a length after the second generated code"
    without = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True, "tiled": False})
    without(q, k, r, v)
    assert without._last.library.extra["generic"]["kernels"] < info["kernels"]  # products specialized


def test_each_engine_owns_its_target_machine(monkeypatch):
    """An MCJIT engine frees the target machine it is given: a generic module built with the
    program's own machine freed it twice (a crash in the conformance suite's teardown of a
    widened template's engine)."""
    import llvmlite.binding as llvm

    given: list = []
    real = llvm.create_mcjit_compiler

    def recording(module, tm, *args, **kwargs):
        given.append(tm)
        return real(module, tm, *args, **kwargs)

    monkeypatch.setattr(llvm, "create_mcjit_compiler", recording)
    src = "function (A[N, K], B[K, M]) -> (C) { T = exp(A) * A; C[n, m: N, M] = +(T[n, k] * B[k, m]); }"
    exe = tile.compile(src, "llvm_cpu.0", {"generic": True, "cache": False})
    for n in (5, 9, 13):  # the product specialized, the elementwise kernel generic: two engines
        exe(np.ones((n, 16), np.float32), np.ones((16, 24), np.float32))
    assert generic.REGISTRY.generated >= 1
    assert len({id(tm) for tm in given}) == len(given), "a target machine given to two engines"
