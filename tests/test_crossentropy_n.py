"""``builtin_binary_crossentropy(P, T, n)`` with a computed ``n``, as PlaidML's Keras writes it.

``n`` changes no value (docs/semantics.md §5.2), so any numeric scalar expression PlaidML accepts
is accepted, and the results equal those with a constant ``n``; a tensor that is not a scalar, or
a bool, is a located error.
"""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry

KERAS = """function (T[X_T_0, X_T_1], P[X_P_0, X_P_1]) -> (O) {
  X_T2 = 1e-7;
  X_T3 = 0.9999999;
  X_T4 = max(P, X_T2);
  X_T5 = min(X_T4, X_T3);
  X_T6 = mul(X_T_0, X_T_1);
  X_T7 = builtin_binary_crossentropy(X_T5, T, X_T6);
  O = ident(X_T7);
}"""
CALL = "builtin_binary_crossentropy(X_T5, T, X_T6)"
CONSTANT_N = KERAS.replace(CALL, "builtin_binary_crossentropy(X_T5, T, 6)")

# P in (0, 1) away from the clip bounds, T in {0, 1}: float64 so the closed form is exact enough
P = np.array([[0.25, 0.5, 0.75], [0.125, 0.625, 0.875]])
T = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])


def closed_form(p, t):
    return -t * np.log(p) - (1 - t) * np.log(1 - p)


def test_the_interpreter_runs_the_keras_program():
    got = tile.compile(KERAS, "interp")(T=T, P=P)["O"]
    np.testing.assert_allclose(got, closed_form(P, T), rtol=4 * np.finfo(np.float64).eps)
    same = tile.compile(CONSTANT_N, "interp")(T=T, P=P)["O"]
    np.testing.assert_array_equal(got, same)  # n changes no value


@pytest.mark.skipif("llvm_cpu.0" not in registry.devices(), reason=f"llvm_cpu.0: {registry.unavailable()}")
def test_llvm_cpu_runs_it_like_the_interpreter():
    p32, t32 = P.astype(np.float32), T.astype(np.float32)
    want = tile.compile(KERAS, "interp")(T=t32, P=p32)["O"]
    got = tile.compile(KERAS, "llvm_cpu.0")(T=t32, P=p32)["O"]
    # log's rounding may differ by an ulp or two per term: three terms, each a few ulps
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(np.float32).eps)


def test_the_gradient_treats_n_as_a_constant():
    grads = tile.grad_values(KERAS, {"T": T, "P": P})
    np.testing.assert_allclose(grads["P"], (1 - T) / (1 - P) - T / P, rtol=8 * np.finfo(np.float64).eps)
    np.testing.assert_allclose(grads["T"], np.log(1 - P) - np.log(P), rtol=8 * np.finfo(np.float64).eps)
    constant = tile.grad_values(CONSTANT_N, {"T": T, "P": P})
    for name in ("T", "P"):
        np.testing.assert_array_equal(grads[name], constant[name])
    text = str(tile.grad(KERAS))
    assert "X_T6" not in text.split("{", 1)[1]  # no adjoint flows into n, nor is it recomputed


@pytest.mark.parametrize(
    ("n", "message"),
    [
        ("T", "the last argument of 'builtin_binary_crossentropy' must be a scalar, not a float64[2, 3]"),
        ("X_T6 > 1", "the last argument of 'builtin_binary_crossentropy' must be a number, not a bool"),
    ],
)
def test_a_non_scalar_or_non_numeric_n_is_a_located_error(n, message):
    src = KERAS.replace(CALL, f"builtin_binary_crossentropy(X_T5, T, {n})")
    with pytest.raises(tile.TileTypeError) as e:
        tile.compile(src, "interp")(T=T, P=P)
    text = str(e.value)
    assert message in text
    line = src.splitlines()[6]
    assert f"<string>:7:{line.index(f', {n})') + 3}:" in text and "^" in text
    assert "hint: pass the element count" in text
