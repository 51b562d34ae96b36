"""The ``math_accuracy`` family: every float function of ``tile.builtins`` on the target, in default
and in strict mode, against its correctly rounded value (``conformance.math_accuracy``), within the
ulp bounds of docs/semantics.md §8.6.

Inputs: all 65536 float16 and bfloat16 bit patterns, and a float32 sample (10^5; 10^7 under
``--conformance-profile=thorough``, in chunks of 10^6) with the special and boundary values; pow's
exponents beside them. One program computes every function, so a target compiles two programs
(default, strict) per dtype. Each (function, dtype, mode) counts as one example; the summary lists
every one's largest error and its input (``Stats.tables["math_accuracy"]``, also in
``--conformance-json``). A function beyond its bound writes a failure folder holding the worst
inputs (up to 64), the correctly rounded values as ``expected.npz`` and the target's as ``got.npz``.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import tile
from conformance import math_accuracy as ma
from conformance import report, targets
from conformance.strategies import Case
from tile.dtypes import DType

CHUNK = 10**6
FLOAT32_COUNT = {"ci": 10**5, "thorough": 10**7}
_REFERENCES: dict[tuple, tuple] = {}  # (dtype, chunk start, count) -> (inputs, references)


def _reference(fmt: ma.Format, start: int, count: int):
    """The chunk's inputs and each function's (correctly rounded, double) values, computed once per
    session (every target reuses them)."""
    key = (fmt.name, start, count)
    if key not in _REFERENCES:
        if fmt.bits is np.uint16:
            ins = ma.inputs(fmt, 0)
        else:
            ins = ma.inputs(fmt, count, seed=start // CHUNK)
        refs = {}
        for f in ma.FUNCTIONS:
            cr, d, _ = ma.correctly_rounded(f, fmt, ins["A"], ins["B"] if f == "pow" else None)
            refs[f] = (cr, d)
        if count >= CHUNK:  # one big chunk at a time: 10^6 inputs hold ~300 MB of references
            for old in [k for k in _REFERENCES if k[2] >= CHUNK]:
                del _REFERENCES[old]
        _REFERENCES[key] = ins, refs
    return _REFERENCES[key]


def _chunks(fmt: ma.Format, profile: str) -> list[tuple[int, int]]:
    if fmt.bits is np.uint16:
        return [(0, 1 << 16)]
    total = FLOAT32_COUNT.get(profile, FLOAT32_COUNT["ci"])
    return [(s, min(CHUNK, total - s)) for s in range(0, total, CHUNK)]


def _digest(fmt: ma.Format, fn: str, mode: str, profile: str) -> str:
    """One example's identity (for the counts and ``--conformance-shard``)."""
    text = f"math_accuracy {fmt.name} {fn} {mode} {profile}\n{ma.program()}"
    return hashlib.sha256(text.encode()).hexdigest()


def _single(fn: str) -> str:
    """The failure folder's program: one function alone."""
    if fn == "pow":
        return "function (A[N], B[N]) -> (O) { O = pow(A, B); }"
    return f"function (A[N]) -> (O) {{ O = {fn}(A); }}"


def _write_failure(target: str, m: ma.Measured, ins: dict, got: np.ndarray, cr: np.ndarray, err) -> str:
    worst = np.argsort(-err, kind="stable")[:64]
    worst = worst[err[worst] > m.bound]
    kept = {"A": ins["A"][worst]} | ({"B": ins["B"][worst]} if m.function == "pow" else {})
    how = "compiled with settings={'strict': True} (tile run --strict)" if m.mode == "strict" else "compiled"
    problem = (
        f"{m.problem()}\n{how}; expected.npz holds the correctly rounded values, so the reproduce "
        "command reruns the default mode and reports every result that is not correctly rounded"
    )
    case = Case("math_accuracy", _single(m.function), kept)
    want, got_ = {"O": cr[worst]}, {"O": got[worst]}
    return report.write_failure(case, target, want, got_, problem, report.Tolerance())


@pytest.mark.parametrize("dtype", list(ma.FORMATS))
def test_math_accuracy(device, dtype, request):
    subject = targets.as_subject(device)
    if subject.device is None:
        pytest.skip(f"{subject.name} names no device: only its passes are checked (test_optimized)")
    check_accuracy(subject, dtype, request.config.getoption("--conformance-profile"))


def check_accuracy(device, dtype: str, profile: str = "ci") -> None:
    """Every function on ``device`` (a device or a ``targets.Subject``) for ``dtype``, in each mode,
    against its bound; counted in ``report.STATS`` and its ``math_accuracy`` table. Raises
    ``AssertionError`` naming each function beyond its bound and its failure folder."""
    subject = targets.as_subject(device)
    fmt = ma.FORMATS[dtype]
    key = report.STATS.current or ("math_accuracy", subject.name)
    if not subject.supports(DType(dtype)):
        for fn in ma.FUNCTIONS:
            for mode in ma.MODES:
                report.STATS.unsupported_example(key, f"{dtype} unsupported", _digest(fmt, fn, mode, profile))
        return
    mine = {
        (fn, mode): targets.SHARD.takes(_digest(fmt, fn, mode, profile))
        for fn in ma.FUNCTIONS
        for mode in ma.MODES
    }
    measured: dict[tuple[str, str], ma.Measured] = {}
    failed: list[str] = []
    for mode, extra in ma.MODES.items():
        functions = tuple(fn for fn in ma.FUNCTIONS if mine[(fn, mode)])
        if not functions:
            continue
        run = tile.compile(ma.program(functions), subject.device.id, {**subject.settings, **extra})
        for start, count in _chunks(fmt, profile):
            ins, refs = _reference(fmt, start, count)
            got = run(**ins)
            for fn in functions:
                m, err = ma.measure(fn, fmt, mode, got[f"O_{fn}"], ins, refs[fn])
                if m.over:
                    failed.append(_write_failure(subject.device.id, m, ins, got[f"O_{fn}"], refs[fn][0], err))
                before = measured.get((fn, mode))
                measured[(fn, mode)] = m if before is None else before.merged(m)
    for (fn, mode), ok in mine.items():
        digest = _digest(fmt, fn, mode, profile)
        if ok:
            report.STATS.example(key, digest)
        else:
            report.STATS.other_shard(key, digest)
    table = report.STATS.tables.setdefault("math_accuracy", [])
    table.extend(m.row(subject.name) for m in measured.values())
    bad = [m for m in measured.values() if m.over]
    if bad:
        lines = [m.problem() for m in bad]
        folders = [f"written to {f}/; reproduce with: {report.reproduce_command(f, subject.device.id)}"
                   for f in dict.fromkeys(failed)]
        raise AssertionError("\n".join(lines + folders))
