"""Cold compile time (issue 40): the shortcuts that make a long program compile faster keep every
answer the same, and the work they save stays saved (counted, not timed: the machine is shared).
bench/compile_time.py measures the times; bench/RESULTS.md has them."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import sympy

import backends.llvm.device as llvm_device
import stripe.gemm_nest as gemm_nest
import tile
from backends import registry
from backends.driver import bind_inputs
from backends.llvm.codegen import buffer_dtypes, units
from backends.llvm.dedup import alike_code, unit_key
from bench.compile_time import chain, inputs, matmuls
from tile.affine import Affine
from tile.linalg import independent, rank


def _matrix(rnd: random.Random) -> list[list]:
    """A small matrix of rationals and ints, often rank-deficient (a row a combination of two)."""
    rows, cols = rnd.randint(0, 6), rnd.randint(1, 6)
    m = [[Fraction(rnd.randint(-4, 4), rnd.choice((1, 1, 2, 3, 7))) if rnd.random() < 0.7 else 0
          for _ in range(cols)] for _ in range(rows)]
    if rows >= 2 and rnd.random() < 0.5:
        m.append([a * Fraction(2, 3) - b for a, b in zip(m[0], m[1])])
    return m


def test_rank_is_exact():
    """The fraction-free elimination gives sympy's exact rank, rationals and ints mixed."""
    rnd = random.Random(40)
    for _ in range(400):
        m = _matrix(rnd)
        want = sympy.Matrix(m).rank() if m else 0
        assert rank(m) == want, m
        if m:
            assert independent(m[:-1], m[-1]) == (rank(m) == len(m))


def _affine(rnd: random.Random) -> Affine:
    names = rnd.sample("ijkl", rnd.randint(0, 3))
    coeffs = {v: Fraction(rnd.randint(-3, 3), rnd.choice((1, 2))) for v in names}
    return Affine.build(coeffs, Fraction(rnd.randint(-5, 5), rnd.choice((1, 3))))


def _canonical(a: Affine) -> bool:
    names = [k for k, _ in a.terms]
    return (names == sorted(names) and all(type(v) is Fraction and v != 0 for _, v in a.terms)
            and type(a.const) is Fraction)


def test_affine_arithmetic_stays_canonical():
    """Sums, differences and products by a scalar (0 and 1 included) have sorted, nonzero Fraction
    terms and the values the coefficients' own arithmetic gives."""
    rnd = random.Random(41)
    for _ in range(2000):
        a, b = _affine(rnd), _affine(rnd)
        s = rnd.choice((0, 1, -1, 2, Fraction(1), Fraction(1, 2)))
        for got, want in (
            (a + b, {k: a.coeff(k) + b.coeff(k) for k in set(a.vars) | set(b.vars)}),
            (a - b, {k: a.coeff(k) - b.coeff(k) for k in set(a.vars) | set(b.vars)}),
            (a * s, {k: a.coeff(k) * s for k in a.vars}),
        ):
            assert _canonical(got), got
            assert got.coeffs == {k: v for k, v in want.items() if v != 0}
        assert (a + b).const == a.const + b.const and (a * s).const == a.const * s
        assert a + 3 == Affine(a.terms, a.const + 3) and (a + Affine()) == a


def test_gemm_nest_read_once_per_kernel(monkeypatch):
    """Naming, the LLVM device's planning and its epilogue reader all read a GEMM kernel's nest:
    the nest is read back from its accesses once per kernel, not once per reader."""
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"no llvm_cpu.0: {registry.unavailable()}")
    calls = []
    real = gemm_nest._read
    monkeypatch.setattr(gemm_nest, "_read", lambda block, plan: calls.append(block) or real(block, plan))
    src, x = chain(12), inputs()
    exe = tile.compile(src, "llvm_cpu.0", {"cache": False})
    got = exe(x)
    want = tile.compile(src, "interp")(x)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    nests = [k for k in exe._last.infos if isinstance(k.block.plan, gemm_nest.GemmPlan)]
    assert nests, "the chain's products should be gemm_tile nests"
    assert len(calls) == len({id(b) for b in calls}) == len(nests)


@pytest.mark.parametrize("program", [chain, matmuls])
def test_llvm_plans_each_distinct_kernel_once(monkeypatch, program):
    """The LLVM device schedules a kernel the same up to names as an earlier one (``dedup``'s key)
    by that one's plan: a program of 40 alike statements is scheduled a handful of times, and it
    shares functions and answers as when each kernel was planned alone."""
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"no llvm_cpu.0: {registry.unavailable()}")
    calls = []
    real = llvm_device.plan
    monkeypatch.setattr(llvm_device, "plan", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    src, x = program(40), inputs()
    exe = tile.compile(src, "llvm_cpu.0", {"cache": False})
    got, want = exe(x), tile.compile(src, "interp")(x)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    lib = exe._last.library
    dtypes = lib.handle.settings.get("buffer_dtypes") or {}
    distinct = {unit_key([k], [buffer_dtypes(k, dtypes)]) for k in lib.kernels}
    assert len(lib.kernels) >= 20 and len(calls) == len(distinct) < len(lib.kernels) / 4


def test_alike_code_views_its_own_buffers():
    """A product planned as an earlier one's flat GEMM views its own buffers, so the zero fill
    before it still pairs with it (``codegen.units``: the micro-kernel starts from zero)."""
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"no llvm_cpu.0: {registry.unavailable()}")
    exe = tile.compile(matmuls(2), "llvm_cpu.0", {"cache": False})
    exe(inputs())
    fill0, prod0, fill1, prod1 = exe._last.library.kernels
    flat = llvm_device.from_nest(prod0.block)
    assert flat is not None, "the products should be gemm_tile nests"
    code0 = replace(prod0, block=flat[0])
    alike = alike_code(code0, prod0, prod1)
    assert {r.source for r in alike.block.refs} == set(prod1.buffers)
    assert units([fill1, alike]) == [(0, 1)] == units([fill0, code0])
    assert units([fill1, code0]) == [(0,), (1,)]  # another product's view would not pair
    assert alike_code(prod0, prod0, prod1) is prod1


def test_lowering_solves_each_index_space_once(monkeypatch):
    """Lowering keeps a contraction's index space (a projection in exact arithmetic) by its
    accesses, sizes and constraints: 40 alike products over other tensors solve it once, and the
    program is the one each solved alone gives."""
    from stripe import lower as lowering
    from stripe.printer import format_block
    from tile.parser import parse

    bound = bind_inputs(parse(matmuls(40)), inputs())
    calls = []
    real = lowering._index_space
    monkeypatch.setattr(lowering, "_index_space", lambda c, d: calls.append(c) or real(c, d))
    kept = format_block(lowering.lower(bound))
    assert len(calls) == 1
    monkeypatch.setattr(lowering._Kernels, "index_space", lambda self, c, d: real(c, d))
    assert format_block(lowering.lower(bound)) == kept


def test_no_cycle_hunts_while_compiling(monkeypatch):
    """The cyclic collector is paused over the whole build (naming the kernels and the runner's
    set-up included, not only the steps that pause it themselves) and the first call: a
    5,000-statement program's live IR made every collection walk millions of objects. It is back
    on afterwards."""
    import gc

    import backends.driver as driver

    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"no llvm_cpu.0: {registry.unavailable()}")
    from backends.runner import CompiledProgram

    seen, runs = [], []
    real, real_run = driver.kernels, CompiledProgram._run
    monkeypatch.setattr(driver, "kernels", lambda program: seen.append(gc.isenabled()) or real(program))
    monkeypatch.setattr(CompiledProgram, "_run", lambda *a: runs.append(gc.isenabled()) or real_run(*a))
    was = gc.isenabled()
    gc.enable()
    try:
        exe = tile.compile(chain(4), "llvm_cpu.0", {"cache": False})
        exe(inputs())
        exe(inputs())
        # the first call (every buffer allocated, every kernel prepared) paused, later ones not
        assert seen == [False] and runs == [False, True] and gc.isenabled()
    finally:
        if not was:
            gc.disable()


def test_fusion_asks_gemm_match_by_set(monkeypatch):
    """Fusion's GEMM check hands ``stripe.gemm.match`` the parent's buffer names as a set-like view
    (membership in O(1)), not a tuple copied per pair and searched per operand: quadratic in the
    buffers of a long program's ``#main``."""
    from collections.abc import Set

    import stripe.passes.fusion as fusion
    from backends.driver import optimized
    from stripe.config import resolve_config
    from stripe.lower import lower
    from tile.parser import parse

    seen = []
    real = fusion.gemm_match
    monkeypatch.setattr(fusion, "gemm_match",
                        lambda a, names, *r, **k: seen.append(names) or real(a, names, *r, **k))
    program = lower(bind_inputs(parse(chain(12)), inputs()))
    optimized(program, resolve_config("llvm_cpu"))
    assert seen and all(isinstance(names, Set) for names in seen)
