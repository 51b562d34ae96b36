"""The benchmark cases shared by the suites: one table of case families, each at several sizes.

A family is a Tile program with the same computation written in numpy (the CPU reference and the
answer every run is checked against) and, optionally, in PyTorch (the GPU reference). Its sizes
come in steps so that throughput can be plotted against size; the interpreter suite takes the
small steps, the compiled suite the larger ones.

Work is counted the usual way: 2 FLOP per multiply-add for contractions (GFLOP/s), bytes read
plus bytes written for memory-bound programs (GB/s). Inputs of contractions are small integers
held in float32, so their sums are exact; the check's tolerance still grows with the reduction
length (``terms``) as the style guide asks, for the programs whose answers are rounded.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tile
from tile import ast

Inputs = dict[str, np.ndarray]

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
CONV3X3 = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, x, y, co: N, H, W, CO] = +(I[n, x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]);
}"""
CONV1X1 = """function (I[N, H, W, CI], K[CI, CO]) -> (O) {
    O[n, x, y, co: N, H, W, CO] = +(I[n, x, y, ci] * K[ci, co]);
}"""
CONV_STRIDED = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, x, y, co: N, H / 2, W / 2, CO] = +(I[n, 2x + kx - 1, 2y + ky - 1, ci] * K[kx, ky, ci, co]);
}"""
MAXPOOL = """function (I[N, H, W, C]) -> (O) {
    O[n, x, y, c: N, H / 2, W / 2, C] = >(I[n, 2x + i, 2y + j, c]), i < 2, j < 2;
}"""
SUM_HW = "function (X[N, H, W, C]) -> (O) { O[n, c: N, C] = +(X[n, h, w, c]); }"
ROW_SUM = "function (X[M, N]) -> (O) { O[i: M] = +(X[i, j]); }"
GLOBAL_SUM = "function (X[M, N]) -> (O) { O[] = +(X[i, j]); }"
GLOBAL_MAX = "function (X[M, N]) -> (O) { O[] = >(X[i, j]); }"
CHAIN = "function (X) -> (Y) { Y = relu(X * 2 + 1) / (1 + exp(-X)); }"
BIAS_TANH = "function (X[N, C], G[C], B[C]) -> (Y) { Y = tanh(X * G + B) * 0.5 + X; }"
# dI of sum(dO * conv3x3(I, K)): the transposed convolution, derived by autodiff.
CONV3X3_GRAD_INPUT = tile.grad(CONV3X3, ["I"])

CH = 32  # channels of the convolution, pooling and reduction cases
# matmul 4096 (137 GFLOP a run) only when asked: minutes on a 2-core machine
BIG = (4096,) if os.environ.get("TILE_BENCH_BIG") else ()


@dataclasses.dataclass(frozen=True)
class Family:
    """One program at several sizes.

    ``make(size, rng)``: the inputs at one size. ``numpy``: the answer, also the CPU reference.
    ``torch``: given the inputs as CUDA tensors, a function running the same computation (its
    layout changes done beforehand, outside the timing), or None; ``torch_nchw``: its result is
    NCHW where ours is NHWC (the check transposes it). ``work``: FLOP or bytes of one
    run. ``terms``: the reduction length, for the tolerance. ``size_desc`` says what ``size`` is.
    """

    name: str
    source: str | ast.Program
    make: Callable[[int, np.random.Generator], Inputs]
    numpy: Callable[[Inputs], np.ndarray]
    work: Callable[[Inputs], float]
    unit: str
    size_desc: str
    interp_sizes: tuple[int, ...]
    compiled_sizes: tuple[int, ...]
    terms: Callable[[Inputs], int] = lambda x: 1
    torch: Callable[[dict], Callable[[], object]] | None = None
    torch_nchw: bool = False


@dataclasses.dataclass(frozen=True)
class Case:
    """A family at one size; ``id`` names it in test ids and reports (``matmul_256``)."""

    family: Family
    size: int

    @property
    def id(self) -> str:
        return f"{self.family.name}_{self.size}"

    def inputs(self) -> Inputs:
        return self.family.make(self.size, np.random.default_rng(self.size))

    def reference(self, inputs: Inputs) -> np.ndarray:
        return self.family.numpy(inputs)

    def work(self, inputs: Inputs) -> float:
        return float(self.family.work(inputs))

    def check(self, got: np.ndarray, want: np.ndarray, inputs: Inputs) -> None:
        """``got`` within 8·eps·K·max(1, max|want|) of ``want``, K the reduction length."""
        got = np.asarray(got)
        assert got.shape == want.shape, f"{self.id}: shape {got.shape}, expected {want.shape}"
        eps = float(np.finfo(np.float32).eps)
        mag = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        tol = 8 * eps * max(1, self.family.terms(inputs)) * mag
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=self.id)


def _ints(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Small integers in float32: products and sums stay exact."""
    return rng.integers(-3, 4, shape).astype(np.float32)


def _floats(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-3, 3, shape).astype(np.float32)


def conv_nhwc(i: np.ndarray, k: np.ndarray, stride: int = 1, pad: int = 1) -> np.ndarray:
    """NHWC convolution with an HWIO kernel, by one BLAS product per kernel tap."""
    kh, kw, _, co = k.shape
    p = np.pad(i, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh = (p.shape[1] - kh) // stride + 1
    ow = (p.shape[2] - kw) // stride + 1
    out = np.zeros((i.shape[0], oh, ow, co), np.float32)
    for a in range(kh):
        for b in range(kw):
            win = p[:, a : a + stride * (oh - 1) + 1 : stride, b : b + stride * (ow - 1) + 1 : stride]
            out += win @ k[a, b]
    return out


def conv_im2col(i: np.ndarray, k: np.ndarray, pad: int = 1) -> np.ndarray:
    """NHWC 'same' stride-1 convolution as numpy users write it: im2col, then one BLAS product."""
    kh, kw, ci, co = k.shape
    n, h, w, _ = i.shape
    p = np.pad(i, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    cols = np.empty((n, h, w, kh, kw, ci), np.float32)
    for a in range(kh):
        for b in range(kw):
            cols[:, :, :, a, b] = p[:, a : a + h, b : b + w]
    return (cols.reshape(n * h * w, kh * kw * ci) @ k.reshape(kh * kw * ci, co)).reshape(n, h, w, co)


def conv_grad_input(do: np.ndarray, k: np.ndarray) -> np.ndarray:
    """dI of a 3x3 'same' convolution: each output gradient scattered back through the taps."""
    n, h, w, _ = do.shape
    kh, kw, ci, _ = k.shape
    p = np.zeros((n, h + 2, w + 2, ci), np.float32)
    for a in range(kh):
        for b in range(kw):
            p[:, a : a + h, b : b + w] += do @ k[a, b].T
    return p[:, 1 : h + 1, 1 : w + 1]


def chain_ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x * 2 + 1, 0) / (1 + np.exp(-x))


_STEPS = (("-", 2), ("+", 3), ("*", 1))  # statement k applies _STEPS[k % 3]: integers stay exact


def long_chain(n: int) -> str:
    """An elementwise program of ``n`` statements, each reading the one before (``T1 = A + 1;
    T2 = T1 - 2; ...; O = T<n-1> + 1;``): how compile time grows with program length (issue 16
    asks for 5,000 statements in under 5 s). Values stay small integers, so answers are exact."""
    lines = ["function (A[N]) -> (O) {", "  T1 = A + 1;"]
    for k in range(2, n):
        op, c = _STEPS[k % 3]
        lines.append(f"  T{k} = T{k - 1} {op} {c};")
    lines += [f"  O = T{n - 1} + 1;", "}"]
    return "\n".join(lines)


def long_chain_ref(a: np.ndarray, n: int) -> np.ndarray:
    """``long_chain(n)`` in numpy, one operation per statement as written."""
    t = a + 1
    for k in range(2, n):
        op, c = _STEPS[k % 3]
        t = t - c if op == "-" else t + c if op == "+" else t * c
    return t + 1


def _nchw(t):
    return t.permute(0, 3, 1, 2).contiguous()


def _oihw(k):
    return k.permute(3, 2, 0, 1).contiguous()


def _torch_conv(stride: int, pad: int):
    def prepare(d):
        import torch

        x, w = _nchw(d["I"]), _oihw(d["K"])
        return lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)

    return prepare


def _torch_conv1x1(d):
    import torch

    x, w = _nchw(d["I"]), d["K"].t().contiguous()[:, :, None, None]
    return lambda: torch.nn.functional.conv2d(x, w)


def _torch_grad_input(d):
    import torch

    dout, w, shape = _nchw(d["DO"]), _oihw(d["K"]), _nchw(d["I"]).shape
    return lambda: torch.nn.grad.conv2d_input(shape, w, dout, padding=1)


def _torch_maxpool(d):
    import torch

    x = _nchw(d["I"])
    return lambda: torch.nn.functional.max_pool2d(x, 2)


def _torch_chain(d):
    import torch

    x = d["X"]
    return lambda: torch.relu(x * 2 + 1) / (1 + torch.exp(-x))


def _torch_bias_tanh(d):
    import torch

    return lambda: torch.tanh(d["X"] * d["G"] + d["B"]) * 0.5 + d["X"]


def _bytes(x: Inputs, out: Callable[[Inputs], int]) -> float:
    """Bytes read (every input once) plus bytes written (float32 output of ``out`` elements)."""
    return sum(v.nbytes for v in x.values()) + 4 * out(x)


FAMILIES: tuple[Family, ...] = (
    Family(
        "matmul",
        MATMUL,
        lambda n, r: {"A": _ints(r, n, n), "B": _ints(r, n, n)},
        lambda x: x["A"] @ x["B"],
        lambda x: 2 * x["A"].shape[0] * x["A"].shape[1] * x["B"].shape[1],
        "GFLOP/s",
        "n (n×n times n×n)",
        (32, 64, 128),
        (128, 256, 512, 1024, 2048, *BIG),
        terms=lambda x: x["A"].shape[1],
        torch=lambda d: lambda: d["A"] @ d["B"],
    ),
    Family(
        "conv3x3",
        CONV3X3,
        lambda h, r: {"I": _ints(r, 1, h, h, CH), "K": _ints(r, 3, 3, CH, CH)},
        lambda x: conv_im2col(x["I"], x["K"]),
        lambda x: 2 * x["I"].size * 9 * CH,
        "GFLOP/s",
        f"H=W (1×H×W×{CH}, 3×3, {CH} out, pad 1)",
        (8, 12, 16),
        (14, 28, 56),
        terms=lambda x: 9 * CH,
        torch=_torch_conv(1, 1),
        torch_nchw=True,
    ),
    Family(
        "conv1x1",
        CONV1X1,
        lambda h, r: {"I": _ints(r, 1, h, h, 2 * CH), "K": _ints(r, 2 * CH, 2 * CH)},
        lambda x: x["I"] @ x["K"],
        lambda x: 2 * x["I"].size * x["K"].shape[1],
        "GFLOP/s",
        f"H=W (1×H×W×{2 * CH}, 1×1, {2 * CH} out)",
        (8, 16, 24),
        (14, 28, 56),
        terms=lambda x: x["K"].shape[0],
        torch=_torch_conv1x1,
        torch_nchw=True,
    ),
    Family(
        "conv3x3_s2",
        CONV_STRIDED,
        lambda h, r: {"I": _ints(r, 1, h, h, CH), "K": _ints(r, 3, 3, CH, CH)},
        lambda x: conv_nhwc(x["I"], x["K"], stride=2),
        lambda x: 2 * (x["I"].size // 4) * 9 * CH,
        "GFLOP/s",
        f"H=W (1×H×W×{CH}, 3×3 stride 2, {CH} out, pad 1)",
        (8, 16, 24),
        (28, 56, 112),
        terms=lambda x: 9 * CH,
        torch=_torch_conv(2, 1),
        torch_nchw=True,
    ),
    Family(
        "maxpool2x2",
        MAXPOOL,
        lambda h, r: {"I": _floats(r, 1, h, h, CH)},
        lambda x: x["I"].reshape(1, x["I"].shape[1] // 2, 2, x["I"].shape[2] // 2, 2, CH).max(axis=(2, 4)),
        lambda x: _bytes(x, lambda v: v["I"].size // 4),
        "GB/s",
        f"H=W (1×H×W×{CH}, 2×2 stride 2)",
        (8, 16, 32),
        (28, 56, 112),
        torch=_torch_maxpool,
        torch_nchw=True,
    ),
    Family(
        "sum_hw",
        SUM_HW,
        lambda h, r: {"X": _ints(r, 2, h, h, 2 * CH)},
        lambda x: x["X"].sum(axis=(1, 2)),
        lambda x: _bytes(x, lambda v: 2 * 2 * CH),
        "GB/s",
        f"H=W (2×H×W×{2 * CH} summed over H and W)",
        (8, 16, 32),
        (32, 64, 128),
        terms=lambda x: x["X"].shape[1] * x["X"].shape[2],
        torch=lambda d: lambda: d["X"].sum(dim=(1, 2)),
    ),
    Family(
        "row_sum",
        ROW_SUM,
        lambda n, r: {"X": _ints(r, n, n)},
        lambda x: x["X"].sum(axis=1),
        lambda x: _bytes(x, lambda v: v["X"].shape[0]),
        "GB/s",
        "n (rows of an n×n matrix summed)",
        (64, 128, 256),
        (1024, 4096),
        terms=lambda x: x["X"].shape[1],
        torch=lambda d: lambda: d["X"].sum(dim=1),
    ),
    Family(
        "global_sum",
        GLOBAL_SUM,
        lambda n, r: {"X": _ints(r, n, n)},
        lambda x: x["X"].sum(),
        lambda x: _bytes(x, lambda v: 1),
        "GB/s",
        "n (sum of an n×n matrix)",
        (64, 128, 256),
        (1024, 4096),
        terms=lambda x: x["X"].size,
        torch=lambda d: lambda: d["X"].sum(),
    ),
    Family(
        "global_max",
        GLOBAL_MAX,
        lambda n, r: {"X": _floats(r, n, n)},
        lambda x: np.max(x["X"]),
        lambda x: _bytes(x, lambda v: 1),
        "GB/s",
        "n (max of an n×n matrix)",
        (64, 128, 256),
        (256, 512, 1024, 2048),
        torch=lambda d: lambda: d["X"].max(),
    ),
    Family(
        "eltwise_chain",
        CHAIN,
        lambda n, r: {"X": _floats(r, n)},
        lambda x: chain_ref(x["X"]),
        lambda x: _bytes(x, lambda v: v["X"].size),
        "GB/s",
        "elements (relu(2x+1) / (1 + exp(-x)))",
        (1 << 12, 1 << 14, 1 << 16),
        (1 << 16, 1 << 18, 1 << 20, 1 << 22),
        torch=_torch_chain,
    ),
    Family(
        "bias_tanh",
        BIAS_TANH,
        lambda n, r: {"X": _floats(r, n, 256), "G": _floats(r, 256), "B": _floats(r, 256)},
        lambda x: np.tanh(x["X"] * x["G"] + x["B"]) * np.float32(0.5) + x["X"],
        lambda x: _bytes(x, lambda v: v["X"].size),
        "GB/s",
        "rows n (n×256, per-column scale and bias broadcast)",
        (16, 64, 256),
        (256, 1024, 4096),
        torch=_torch_bias_tanh,
    ),
    Family(
        "conv3x3_grad_input",
        CONV3X3_GRAD_INPUT,
        lambda h, r: {"I": _ints(r, 1, h, h, CH), "K": _ints(r, 3, 3, CH, CH), "DO": _ints(r, 1, h, h, CH)},
        lambda x: conv_grad_input(x["DO"], x["K"]),
        lambda x: 2 * x["DO"].size * 9 * CH,
        "GFLOP/s",
        f"H=W (dI of the 1×H×W×{CH} 3×3 conv, by tile.grad)",
        (8, 12, 16),
        (14, 28, 56),
        terms=lambda x: 9 * CH,
        torch=_torch_grad_input,
        torch_nchw=True,
    ),
    Family(
        "chain_5000_statements",  # for its compile time (recorded apart); the run is memory-bound
        long_chain(5000),
        lambda n, r: {"A": _ints(r, n)},
        lambda x: long_chain_ref(x["A"], 5000),
        lambda x: _bytes(x, lambda v: v["A"].size),
        "GB/s",
        "elements n of A (5,000 statements, each reading the one before)",
        (),
        (4096,),
    ),
)


def cases(suite: str) -> list[Case]:
    """Every family at the sizes of ``suite``: ``"interp"`` (small) or ``"compiled"``."""
    assert suite in ("interp", "compiled"), suite
    return [
        Case(f, size)
        for f in FAMILIES
        for size in (f.interp_sizes if suite == "interp" else f.compiled_sizes)
    ]


# ---------------------------------------------------------------- measuring, shared by the suites
def best_of(fn: Callable[[], object], budget_s: float = 0.3, least: int = 3, most: int = 50) -> float:
    """The fastest of ``least`` runs of ``fn``, and of more while they fit in ``budget_s``."""
    best, spent, n = float("inf"), 0.0, 0
    while n < least or (n < most and spent < budget_s):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent, n = min(best, dt), spent + dt, n + 1
    return best


def rounds_for(once_s: float, budget_s: float = 0.3) -> int:
    """Benchmark rounds that fit in about ``budget_s``: 3 for slow runs, up to 30 for fast ones."""
    return max(3, min(30, int(budget_s / max(once_s, 1e-6))))


# One run per case in a fresh process (PlaidML aborts the process on some errors): the program is
# compiled by a first invocation, then timed in-process, so neither the compile nor the transfer
# of inputs between processes is counted. The answer comes back to be checked.
_PLAIDML_TIMER = r"""
import os, pickle, sys, time
from conformance.plaidml_peer import ENV, output_names
os.environ.update(ENV)
reply = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)  # PlaidML's own prints stay out of the reply
import numpy as np, plaidml
source, inputs, budget = pickle.load(sys.stdin.buffer)
ctx = plaidml.Context()
dev = plaidml.Device(ctx, plaidml.devices(ctx, limit=10)[0])
ins = {}
for name, arr in inputs.items():
    ins[name] = plaidml.Tensor(dev, plaidml.Shape(ctx, plaidml.DType.FLOAT32, *arr.shape))
    with ins[name].mmap_discard(ctx) as view:
        view.copy_from_ndarray(np.ascontiguousarray(arr, np.float32))
        view.writeback()
invoker = plaidml.Invoker(ctx, plaidml.Function(source), ins)
outs = {}
for name in output_names(source):
    shape = invoker.get_output_shape(name)
    outs[name] = (plaidml.Tensor(dev, shape), tuple(d.size for d in shape.dimensions))
    invoker.set_output(name, outs[name][0])
def once():
    invoker.invoke()
    for t, _ in outs.values():
        with t.mmap_current():
            pass
once()
best, spent, n = float("inf"), 0.0, 0
while n < 3 or (n < 50 and spent < budget):
    t0 = time.perf_counter()
    once()
    dt = time.perf_counter() - t0
    best, spent, n = min(best, dt), spent + dt, n + 1
result = {}
for name, (t, dims) in outs.items():
    result[name] = np.zeros(dims, np.float32)
    with t.mmap_current() as view:
        view.copy_to_ndarray(result[name])
pickle.dump((best, result), reply)
"""
_plaidml_seen: dict[str, tuple[float | None, str]] = {}


def plaidml_reference(case: Case, inputs: Inputs) -> tuple[float | None, str]:
    """Seconds of one run of the case on PlaidML 0.7 (its ``llvm_cpu.0`` device, compile excluded,
    answer checked), or None and why not. Each case is timed once per session."""
    if case.id not in _plaidml_seen:
        _plaidml_seen[case.id] = _time_plaidml(case, inputs)
    return _plaidml_seen[case.id]


def add_plaidml_reference(case: Case, inputs: Inputs, references: dict, notes: dict) -> None:
    """PlaidML's seconds as ``references["plaidml"]``, or why not as ``notes["plaidml_skipped"]``."""
    seconds, why = plaidml_reference(case, inputs)
    if seconds is not None:
        references["plaidml"] = seconds
    else:
        notes["plaidml_skipped"] = why


def _time_plaidml(case: Case, inputs: Inputs) -> tuple[float | None, str]:
    try:
        from conformance import plaidml_peer
    except ImportError as e:
        return None, f"conformance/plaidml_peer.py is not importable ({e})"
    why = plaidml_peer.unavailable()
    if why:
        return None, why
    from tile.printer import format_program

    src = case.family.source
    text = src if isinstance(src, str) else format_program(src)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-c", _PLAIDML_TIMER]
    try:
        done = subprocess.run(
            cmd, input=pickle.dumps((text, inputs, 0.3)), capture_output=True, timeout=120, env=env
        )
    except subprocess.TimeoutExpired:
        return None, f"PlaidML gave no answer for {case.id} within 120 s"
    if done.returncode != 0:
        log = [ln for ln in done.stderr.decode(errors="replace").splitlines() if not ln.startswith("INFO:")]
        return None, f"PlaidML failed on {case.id} (exit status {done.returncode}): {' '.join(log[-3:])}"
    seconds, outputs = pickle.loads(done.stdout)
    (got,) = outputs.values()
    try:
        case.check(got, case.reference(inputs), inputs)
    except AssertionError as e:
        return None, f"PlaidML's answer for {case.id} differs from numpy: {str(e).strip()[:200]}"
    return seconds, ""


def require_timing(benchmark) -> None:
    """Skips a timed bench test whose ``benchmark`` fixture is disabled (pytest-benchmark disables
    itself under xdist's ``-n`` and with ``--benchmark-disable``): it would time nothing."""
    if getattr(benchmark, "disabled", False):
        import pytest

        pytest.skip("pytest-benchmark is disabled (under xdist's -n, or --benchmark-disable): run bench/ "
                    "without -n to time it")


def record(
    benchmark,
    case: Case,
    target: str,
    inputs: Inputs,
    seconds: float,
    compile_s: float,
    references: dict[str, float],
    notes: dict[str, str],
) -> None:
    """Put the rates into ``benchmark.extra_info`` (what ``python -m bench report`` reads) and print
    a line. ``references``: ``{name: seconds}``, the primary reference first."""
    work = case.work(inputs)
    rate = work / seconds / 1e9
    ref_rates = {name: work / t / 1e9 for name, t in references.items()}
    primary = next(iter(references))
    benchmark.extra_info.update(
        {
            "case": case.family.name,
            "size": case.size,
            "size_desc": case.family.size_desc,
            "target": target,
            "rate": rate,
            "unit": case.family.unit,
            "reference": primary,
            "reference_rate": ref_rates[primary],
            "ratio": references[primary] / seconds,
            "references": ref_rates,
            "compile_s": compile_s,
            **notes,
        }
    )
    others = ", ".join(f"{n} {r:.3g}" for n, r in ref_rates.items())
    print(
        f"\n{target} {case.id}: {rate:.3g} {case.family.unit} ({others}), "
        f"ratio to {primary} {references[primary] / seconds:.3f}, compile {compile_s:.3g} s"
        + "".join(f"; {k} {v:.3g}" if isinstance(v, float) else f"; {k} {v}" for k, v in notes.items())
    )
