"""Run ONNX's node tests (``onnx.backend.test``'s ~1,900 generated cases) through ``tile.onnx``
in one process, and count them per operator: a quick measure while writing converters.

    python -m tile.onnx.node_tests --target interp [-k REGEX] [--failures]

Each case's inputs go through ``Backend.prepare(model, target).run``; outputs are compared with the
case's own ``rtol``/``atol`` (numpy's ``assert_allclose``, nan equal to nan) and exactly for
integers and bool, as ONNX's runner does. ``conformance/ --onnx`` is the suite's integration.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter, defaultdict

import numpy as np


def cases(pattern: str | None = None) -> list:
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = load_model_tests(kind="node")
    rx = re.compile(pattern) if pattern else None
    return [c for c in found if rx is None or rx.search(c.name)]


def check(case, target: str) -> tuple[str, str]:
    """``("pass", "")``, ``("fail", why)`` (a wrong answer) or ``("error", why)`` (refused or crashed)."""
    from tile.onnx.backend import Backend

    try:
        rep = Backend.prepare(case.model, target)
        for inputs, expected in case.data_sets:
            inputs, expected = [_array(a) for a in inputs], [_array(a) for a in expected]
            if any(not isinstance(a, np.ndarray) for a in [*inputs, *expected]):
                return "error", "sequence or optional values are not supported"
            got = rep.run(inputs)
            if len(got) != len(expected):
                return "fail", f"{len(got)} outputs, expected {len(expected)}"
            for g, e in zip(got, expected):
                why = compare(np.asarray(g), e, case.rtol, case.atol)
                if why:
                    return "fail", why
    except Exception as e:  # every failure is reported and counted, never fatal to the run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return "error", f"{type(e).__name__}: {first}"[:300]
    return "pass", ""


def _array(a):
    from onnx import TensorProto, numpy_helper

    if isinstance(a, TensorProto):
        return numpy_helper.to_array(a)
    return np.asarray(a) if isinstance(a, np.generic) else a


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind in "biu":
        bad = np.count_nonzero(got != want)
        return f"{bad} of {want.size} elements differ" if bad else ""
    g, w = got.astype(np.float64), want.astype(np.float64)
    ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return ""
    k = int(np.argmin(ok.ravel()))
    first = f"{g.ravel()[k]!r} vs {w.ravel()[k]!r}"
    return f"{np.count_nonzero(~ok)} of {want.size} elements differ (first: {first})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="interp")
    ap.add_argument("-k", dest="pattern", default=None, help="regex over the test names")
    ap.add_argument("--failures", action="store_true", help="print each failing case and why")
    args = ap.parse_args(argv)
    import tile.onnx  # noqa: F401

    by_op: dict[str, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    start = time.time()
    for case in cases(args.pattern):
        op = case.model.graph.node[0].op_type if len(case.model.graph.node) == 1 else "(graph)"
        status, why = check(case, args.target)
        by_op[op][status] += 1
        totals[status] += 1
        if args.failures and status != "pass":
            print(f"{status:5} {case.name}: {why}", flush=True)
    n = sum(totals.values())
    for op in sorted(by_op):
        c = by_op[op]
        if c["pass"] != sum(c.values()):
            print(f"  {op:28} {c['pass']}/{sum(c.values())}")
    print(f"{args.target}: {totals['pass']}/{n} passed ({100 * totals['pass'] / max(n, 1):.1f}%), "
          f"{totals['fail']} wrong, {totals['error']} refused or errors, {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
