"""Row reductions in shape-generic kernels (issue 40, ``backends.llvm.generic``) run as
``rowreduce``'s vector loops, as the specialized kernel does: along a fixed row length with the
row count at run time, and along a run-time row length (its masked last vector only where lanes
are left). Integer-valued inputs, so every order of the sums is exact: equal to the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm import generic
from tests.generic_support import fresh_registry, generic_info, ints  # noqa: F401

pytestmark = pytest.mark.usefixtures("private_cache")

AGGS = {"+": "fadd", ">": "fmaximum", "<": "fminimum"}


def row_program(agg: str) -> str:
    return f"function (X[N, D]) -> (O) {{ O[i : N] = {agg}(X[i, d]); }}"


def generic_sources() -> list[str]:
    """The optimized LLVM IR of every generic form built in this process (``generic.REGISTRY``)."""
    forms = [b.form for b in generic.REGISTRY.buckets.values() if b.form is not None]
    return [str(f.engine[1]) for f in forms]


def vector_width() -> int:
    from backends.llvm.host import host_target
    from backends.llvm.match import host_vector_bytes

    return host_vector_bytes(host_target()[1])


def run_lengths(src: str, shapes, dtype=np.float32, settings: dict | None = None, every: bool = False):
    """Compile ``src`` generic, run it at ``shapes`` against the interpreter (exactly), and return
    the generic kernel count of the last call (``every``: of each call, as a list)."""
    exe = tile.compile(src, "llvm_cpu.0", {"generic": True, "cache": False, **(settings or {})})
    ref = tile.compile(src, "interp")
    counts = []
    for k, shape in enumerate(shapes):
        x = ints(shape, k).astype(dtype)
        np.testing.assert_array_equal(exe(x)["O"], ref(x)["O"], err_msg=f"{src} at {shape}")
        counts.append(generic_info(exe, x)["kernels"])
    return counts if every else counts[-1]


@pytest.fixture
def generic_rows(monkeypatch) -> list:
    """The generic kernels' rows ``rowreduce.emit`` generated (``codegen`` calls it by this name)."""
    from backends.llvm import codegen

    seen, emit = [], codegen.emit_rows

    def counted(cg, block, p, *args):
        if cg.slots:
            seen.append((p.agg, block.idxs[p.k].range))
        return emit(cg, block, p, *args)

    monkeypatch.setattr(codegen, "emit_rows", counted)
    return seen


@pytest.mark.parametrize("agg", list(AGGS))
def test_fixed_row_length_generic_rows_are_vector_reductions(agg, generic_rows):
    """N varies, D = 64: the generic kernel's rows reduce in vectors (before: plain loops, 0.80 of
    the specialized kernel at 1000x64, bench/RESULTS.md)."""
    if not vector_width():
        pytest.skip("the host has no float vectors rowreduce uses")
    counts = run_lengths(row_program(agg), [(n, 64) for n in (5, 9, 13, 100, 1000, 3)], every=True)
    assert all(c >= 1 for c in counts[1:]), f"generic kernels per length: {counts}"
    assert generic_rows and all(a == {"+": "add", ">": "max", "<": "min"}[agg] for a, _ in generic_rows)
    assert all(n == 64 for _, n in generic_rows)  # the row length stays a constant
    if agg == "+":  # (LLVM vectorizes a plain loop's max or min too, never this sum)
        assert any("llvm.vector.reduce.fadd" in t for t in generic_sources())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("agg", list(AGGS))
def test_run_time_row_length_every_tail_exact(agg, dtype, generic_rows):
    """D varies through every tail of a vector and short rows (N = D + 4: with N fixed the zero fill
    before the sum has no run-time integer, so neither runs generic): the row length at run time,
    equal to the interpreter, every length past the template's two run generic."""
    from backends.llvm import symbolic

    if not vector_width():
        pytest.skip("the host has no float vectors rowreduce uses")
    lengths = (20, 24, 17, 31, 33, 64, 65, 100, 130, 16, 5, 2, 3)
    counts = run_lengths(row_program(agg), [(d + 4, d) for d in lengths], dtype, every=True)
    assert all(c >= 1 for c in counts[1:9]), f"generic kernels per length: {counts}"
    assert generic_rows and all(symbolic.is_slot(n) for _, n in generic_rows)
    assert any(f"llvm.vector.reduce.{AGGS[agg]}" in t and "llvm.masked.load" in t for t in generic_sources())


def test_both_lengths_at_run_time():
    if not vector_width():
        pytest.skip("the host has no float vectors rowreduce uses")
    shapes = [(9, 20), (11, 23), (3, 70), (40, 16), (1000, 65), (2, 1), (5, 5)]
    assert run_lengths(row_program("+"), shapes) >= 1


def test_strict_generic_rows_keep_the_order():
    kernels = run_lengths(row_program("+"), [(n, 64) for n in (5, 9, 13, 100)], settings={"strict": True})
    assert kernels >= 1
    assert not any("llvm.vector.reduce" in t for t in generic_sources())


def test_generic_rows_give_the_specialized_bits():
    """Random floats, D = 64 fixed: the generic kernel sums each row in the specialized kernel's
    order (the same vector accumulators), so the bits agree at every row count (before, its plain
    loop summed each row in index order)."""
    if not vector_width():
        pytest.skip("the host has no float vectors rowreduce uses")
    src = row_program("+")
    gen = tile.compile(src, "llvm_cpu.0", {"generic": True, "cache": False})
    spec = tile.compile(src, "llvm_cpu.0", {"cache": False})
    rng = np.random.default_rng(11)
    for n in (6, 10, 37, 128, 129, 1000):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        got, want = gen(x)["O"], spec(x)["O"]
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"N={n}")
    assert generic_info(gen, x)["kernels"] >= 1
