"""What a ``tile.torch`` op with ``dynamic=True`` does again at each new length whose kernels all
bind existing templates (issue 40's per-length cost): the gradient program is derived once from
the dtypes (sizes by the declared dimensions' names), not once per length, when that derivation
assumed nothing; an op whose gradient needs its shapes still derives it per shape."""

from __future__ import annotations

import pytest

import tile.autodiff
from bench.compile_time import ATTENTION
from tests.generic_support import fresh_registry  # noqa: F401
from tests.test_generic_cold import _attention, _check
from tile.bridge import Op

pytestmark = pytest.mark.usefixtures("private_cache")


def _counted(monkeypatch) -> list:
    """Every gradient derivation's ``shapes`` argument, in order."""
    seen: list = []
    real = tile.autodiff.gradient

    def counted(*args, **kwargs):
        seen.append(kwargs.get("shapes"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tile.autodiff, "gradient", counted)
    return seen


def test_dynamic_op_derives_its_gradient_once(monkeypatch):
    """Four lengths forward + backward: one derivation (without shapes), every gradient right."""
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.torch as tt

    op = tt.op(ATTENTION, dynamic=True)
    seen = _counted(monkeypatch)
    for n in (5, 6, 7, 9):
        args = _attention(torch, n)
        y = op(*args)
        y.sum().backward()
        _check(torch, args, y)
    assert seen == [None]


def test_a_gradient_that_needs_shapes_is_derived_per_shape(monkeypatch):
    """``A + B`` with differently named dimensions broadcast together: the derivation without shapes
    notes an assumption, so each shape derives its own (and ``B``'s gradient sums the broadcast rows
    only where ``B`` has one row)."""
    np = pytest.importorskip("numpy")
    op = Op("function (A[N, M], B[K, M]) -> (C) { C = A + B; }", "add", {"generic": True})
    seen = _counted(monkeypatch)
    for rows in (1, 3):
        key = (((3, 2), np.dtype("float32")), ((rows, 2), np.dtype("float32")))
        g = op.gradient(key, (0, 1))
        assert seen[-1] is not None
        run = op._compile(g.program, "interp", {})
        a, b = np.ones((3, 2), np.float32), np.ones((rows, 2), np.float32)
        out = run({"A": a, "B": b, **{c: np.ones((3, 2), np.float32) for c in g.cotangents.values()}})
        assert out[g.gradients["B"]].tolist() == [[3.0 if rows == 1 else 1.0] * 2] * rows
    assert None in seen and len([s for s in seen if s is not None]) == 2


def test_dynamic_op_checks_its_programs_once(monkeypatch):
    """``tile.compile``'s checks (``lint.early_check``) run once for the forward program and once
    for the gradient program, not at every new length (one ``Executable`` per program and device)."""
    torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    import tile.lint
    import tile.torch as tt

    op = tt.op(ATTENTION + "\n", dynamic=True)  # (another text: not test 1's shared op)
    checked: list = []
    real = tile.lint.early_check
    monkeypatch.setattr(tile.lint, "early_check", lambda p: (checked.append(p), real(p))[1])
    for n in (10, 11, 12):
        args = _attention(torch, n)
        y = op(*args)
        y.sum().backward()
        _check(torch, args, y)
    assert len(checked) == 2 and len({id(p) for p in checked}) == 2
