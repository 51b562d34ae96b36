"""``tile.shapes.same_size``: the fast paths (identical sizes, polynomial differences) answer as
simplify does, for equal and unequal sizes."""

from __future__ import annotations

import sympy

from tile.shapes import same_size

N, M = sympy.symbols("N M", positive=True, integer=True)


def test_identical_and_polynomial_sizes():
    assert same_size(N, N)
    assert same_size(8, 8)
    assert not same_size(8, 9)
    assert not same_size(N, 8)
    assert same_size((N + 1) * (N - 1), N**2 - 1)
    assert not same_size(N * M, N + M)
    assert same_size(2 * N - N, N)


def test_non_polynomial_sizes_still_simplify():
    assert same_size(sympy.floor(N / 2) + 0, sympy.floor(N / 2))
    assert not same_size(sympy.floor(N / 2), sympy.floor(N / 3))
    assert same_size(sympy.Max(N, M), sympy.Max(M, N))


def test_polynomial_sizes_do_not_simplify(monkeypatch):
    """simplify took 25 ms a call: 1,000 statements mixing ``N`` and ``8`` paid 25 s in binding."""
    calls = []
    real = sympy.simplify
    monkeypatch.setattr(sympy, "simplify", lambda e, *a, **k: calls.append(e) or real(e, *a, **k))
    assert not same_size(N, 8) and same_size(N, N) and same_size((N + 1) * (N - 1), N**2 - 1)
    assert calls == []
