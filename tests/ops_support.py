"""Checks shared by tests/test_ops_*.py: an op's source against torch, forward and gradient.

Forward: the reference interpreter and ``llvm_cpu.0`` (through ``tile.compile``) on the same
inputs; exactly equal to torch where every intermediate is exact (integer-valued data, sums of
them), else within ``k * eps * K * max(1, |want|)`` for the dtype's eps and a reduction length K.
Gradient: ``tile.grad`` of the source for one output, run by the interpreter in float64, against
``torch.autograd.grad`` of the same function on the same float64 inputs and cotangents.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from tile.dtypes import DType

torch = pytest.importorskip("torch", reason="the op library is checked against torch.nn.functional")

LLVM = "llvm_cpu.0"
HAVE_LLVM = LLVM in registry.devices()


@functools.cache
def compiled(src: str):
    return tile.compile(src, device=LLVM)


def integers(shape, low=-3, high=4, dtype=np.float32, seed=0) -> np.ndarray:
    """Small integer values as floats, so that sums and products are exact."""
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(dtype)


def uniform(shape, dtype=np.float64, seed=0, low=-2.0, high=2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(dtype)


def run_all(src: str, inputs: dict) -> list[tuple[str, dict]]:
    """The outputs from the interpreter and, where present, llvm_cpu.0."""
    results = [("ref_interp", ref_interp.run(src, inputs))]
    if HAVE_LLVM:
        results.append((LLVM, compiled(src)(**inputs)))
    return results


def tolerance(want: np.ndarray, dtype, K: int, k: float = 4.0) -> np.ndarray:
    eps = np.finfo(dtype).eps
    return k * eps * K * np.maximum(1.0, np.abs(want))


def check(src: str, inputs: dict, want, *, output: str = "Y", exact: bool = False, K: int = 1,
          k: float = 4.0) -> None:
    """The op's ``output`` equals ``want`` (a torch tensor or array) on every target."""
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    for target, outs in run_all(src, inputs):
        got = np.asarray(outs[output])
        assert got.shape == want.shape, (target, got.shape, want.shape)
        if exact or not np.issubdtype(want.dtype, np.floating):
            np.testing.assert_array_equal(got, want, err_msg=target)
        else:
            dtype = got.dtype if np.issubdtype(got.dtype, np.floating) else want.dtype
            err = np.abs(got.astype(np.float64) - want.astype(np.float64))
            tol = tolerance(want.astype(np.float64), dtype, K, k)
            assert np.all(err <= tol), f"{target}: max error {err.max()} over {tol.min()} (K={K})"


def check_grad(src: str, inputs: dict, fn, wrt: list[str], *, output: str = "Y", K: int = 1,
               k: float = 16.0, seed: int = 1, llvm: bool = False) -> None:
    """The gradient program of ``src`` equals torch's autograd of ``fn`` (taking the inputs as
    float64 tensors, in the source's input order given by ``inputs``) for a random cotangent; run
    by the interpreter, and with ``llvm=True`` compiled for llvm_cpu.0 too (what the framework
    bridges run)."""
    arrays = {n: np.asarray(v) for n, v in inputs.items()}
    tensors = {n: torch.tensor(v, requires_grad=n in wrt) for n, v in arrays.items()}
    result = fn(*tensors.values())
    cot = uniform(tuple(result.shape), seed=seed)
    wanted = torch.autograd.grad(result, [tensors[n] for n in wrt], torch.tensor(cot), allow_unused=True)
    dtypes = {n: DType.of(v.dtype) for n, v in arrays.items()}
    shapes = {n: tuple(v.shape) for n, v in arrays.items()}
    program = tile.grad(src, wrt=wrt, outputs=[output], dtypes=dtypes, shapes=shapes)
    feed = {**arrays, f"D{output}": cot}
    runs = [("ref_interp", ref_interp.run(program, feed))]
    if llvm and HAVE_LLVM:
        runs.append((LLVM, tile.compile(program, device=LLVM)(**feed)))
    for target, outs in runs:
        _compare_grads(target, {n: outs[f"D{n}"] for n in wrt}, wanted, arrays, wrt, cot, K, k)


def _compare_grads(target, got, wanted, arrays, wrt, cot, K, k) -> None:
    for name, want in zip(wrt, wanted):
        want = np.zeros(arrays[name].shape) if want is None else want.numpy()
        g = np.asarray(got[name], np.float64)
        assert g.shape == want.shape, (target, name, g.shape, want.shape)
        err = np.abs(g - want)
        tol = tolerance(want, np.float64, K, k) * max(1.0, float(np.abs(cot).max(initial=0.0)))
        assert np.all(err <= tol), f"{target}: d{name}: max error {err.max()} (K={K})"
