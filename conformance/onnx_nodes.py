"""The ONNX node tests as a conformance source (``pytest conformance/ --onnx``).

``onnx.backend.test`` holds about 1,900 node cases: one operator (or its function expansion) with
inputs and the outputs ONNX's own numpy reference computed for them, data nobody here wrote. Each
case is imported by ``tile.onnx``, run on a Tile target (the interpreter included) and compared
with the case's own ``rtol``/``atol`` (``np.isclose``'s rule, as ONNX's runner applies it), and
exactly for integers and bool. A case ends as one of:

* ``passed``;
* ``failed``, with what differed or what was raised (a Tile bug);
* ``expected``: a documented difference (docs/semantics.md §13): a float16 or bfloat16 output
  outside the case's rtol but within ``ROUNDINGS`` units of the type's roundoff, or a case listed in
  ``KNOWN`` with its class;
* ``unsupported``, with why: an operator or attribute ``tile.onnx`` has no converter for, a value
  Tile has no type for (sequences, optionals, strings, complex; float8, float4 and the 4- and 2-bit
  integers are carried in wider Tile types, ``tile.onnx.carried``, and run), or a
  dtype the target lacks.

Every outcome is recorded in ``conformance.report.STATS.onnx`` as a ``Record``, and summarised per
operator and dtype (``lines``, ``summary``) in the suite's terminal summary and its
``--conformance-json``. This module imports ``onnx`` only when a case is loaded, so the suite
runs without it (``unavailable`` says why the ONNX cases skip).
"""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np

EXPANDED = re.compile(r"_expanded(_ver\d+)?$")

# The unit roundoff of the narrow floats. ONNX's default rtol (1e-3) is about two units of float16's
# and a quarter of bfloat16's, so where ONNX's reference rounds once and Tile at each step (or a
# compiled target sums in another order, docs/semantics.md §8.3), a correct result can miss it: a
# narrow-float output that fails the case's rtol but is within ROUNDINGS units of roundoff is counted
# as an expected difference (docs/semantics.md §13), not as passed.
NARROW = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
ROUNDINGS = 4

# Cases whose failure is understood (name -> (class, reason)): "difference" for a documented
# semantic difference (docs/semantics.md §13), "bug" for a Tile bug reported but not fixed yet.
# A listed case that fails is counted as expected (xfail); one that passes is reported as such, so
# the list cannot go stale silently (test_onnx_nodes.py checks that every name is a case).
_DFT_NOISE = ("the imaginary part of an inverse DFT of a real signal's spectrum is 0; ONNX's stored "
              "output holds its float32 FFT's rounding there (about 2e-7, over the case's atol of 1e-7), "
              "Tile's about 1e-14 (docs/semantics.md §13 item 5)")
KNOWN: dict[str, tuple[str, str]] = {
    "test_dft_inverse": ("difference", _DFT_NOISE),
    "test_dft_inverse_opset19": ("difference", _DFT_NOISE),
}


def unavailable() -> str | None:
    """Why the ONNX node tests cannot run here, or None."""
    try:
        import onnx  # noqa: F401
        import onnx.backend.test.loader  # noqa: F401
    except ImportError as e:
        return f"onnx is not installed ({e}): pip install onnx (or pip install -e '.[onnx]')"
    return None


@dataclass(frozen=True)
class Record:
    """One case's outcome on one target (the unit the summary counts)."""

    case: str
    operator: str
    dtype: str
    target: str
    status: str  # passed | failed | expected | unsupported
    reason: str = ""
    seconds: float = 0.0


@cache
def cases() -> dict:
    """The node cases by name (ONNX generates them from its case modules at first use)."""
    import onnx.backend.test.loader as loader

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the case generators' own overflow warnings
        found = loader.load_model_tests(kind="node")
    return {c.name: c for c in found}


def names() -> list[str]:
    return sorted(cases())


def operator(case) -> str:
    """The operator a case tests: its node's ``op_type``; an ``_expanded`` case (the operator's
    function body, several nodes) is named ``Op/expanded`` after its unexpanded twin."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return nodes[0].op_type
    twin = cases().get(EXPANDED.sub("", case.name))
    if twin is not None and twin is not case and len(twin.model.graph.node) == 1:
        return f"{twin.model.graph.node[0].op_type}/expanded"
    return "+".join(dict.fromkeys(n.op_type for n in nodes))


def _array(value):
    """A case's value as numpy (ONNX stores float8, 4-bit and a few others as TensorProto)."""
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    return value


def elem_name(elem: int) -> str:
    """An ONNX element type by its numpy name (float32, bfloat16, float8_e4m3fn, ...; string)."""
    from onnx import helper

    np_type = helper.tensor_dtype_to_np_dtype(elem)
    return "string" if np_type == np.dtype(object) else np_type.name


def dtype_of(case) -> str:
    """The dtype a case is filed under: its first input's (or first output's) element type, or the
    kind of value (sequence, optional) where that is not a tensor."""
    for info in [*case.model.graph.input, *case.model.graph.output]:
        kind = info.type.WhichOneof("value")
        if kind != "tensor_type":
            return kind.removesuffix("_type")
        return elem_name(info.type.tensor_type.elem_type)
    return "none"


def _tensor_elem(info) -> int | None:
    """The element type of a graph input or output that is a tensor, or an optional tensor (which
    ``tile.onnx`` takes as the tensor it holds); None for any other value."""
    kind = info.type.WhichOneof("value")
    if kind == "tensor_type":
        return info.type.tensor_type.elem_type
    if kind == "optional_type" and info.type.optional_type.elem_type.HasField("tensor_type"):
        return info.type.optional_type.elem_type.tensor_type.elem_type
    return None


def lacking(case) -> str | None:
    """Why a case's values are outside Tile's types (None: every input and output is a tensor, or a
    given optional tensor, of a Tile dtype or one ``tile.onnx`` carries)."""
    from tile.dtypes import DType
    from tile.onnx.carried import BY_NAME

    known = {d.value for d in DType} | set(BY_NAME)  # Tile's dtypes, and those tile.onnx carries in them
    inputs, expected = case.data_sets[0] if case.data_sets else ([], [])
    data = list(inputs) + [None] * (len(case.model.graph.input) - len(inputs)) + list(expected)
    for info, value in zip([*case.model.graph.input, *case.model.graph.output], data):
        kind = info.type.WhichOneof("value")
        elem = _tensor_elem(info)
        if elem is None:
            return f"'{info.name}' is an ONNX {kind.removesuffix('_type')} value: Tile has tensors only"
        if kind == "optional_type" and value is None:
            return f"'{info.name}' is an empty ONNX optional: the backend takes arrays"
        name = elem_name(elem)
        if name not in known:
            return f"'{info.name}' is {name}, a type Tile has no dtype for"
    return None


def target_lacks(case, device) -> str | None:
    """A dtype among the case's inputs and outputs that ``device`` (None: the interpreter) lacks."""
    if device is None:
        return None
    from tile.dtypes import DType
    from tile.onnx.carried import BY_NAME

    for info in [*case.model.graph.input, *case.model.graph.output]:
        name = elem_name(_tensor_elem(info))
        dt = BY_NAME[name].carrier if name in BY_NAME else DType(name)
        if not device.capabilities.supports(dt):
            return f"{dt.value} unsupported by the target"
    return None


def differs(want, got, rtol: float, atol: float) -> str | None:
    """What differs between an expected output and Tile's, or None: dtype and shape exactly, values
    within ``atol + rtol * |want|`` for floats (NaN matching NaN), exactly otherwise."""
    want, got = np.asarray(want), np.asarray(got)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"expected {want.dtype}{list(want.shape)}, got {got.dtype}{list(got.shape)}"
    if want.dtype.kind in "fc" or want.dtype.name == "bfloat16" or want.dtype.name.startswith("float"):
        w, g = want.astype(np.float64), got.astype(np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True) | (g == w)
    else:
        ok = got == want
    if ok.all():
        return None
    bad = np.argwhere(~ok) if want.ndim else [()]
    shown = ", ".join(f"[{', '.join(map(str, ix))}] expected {want[tuple(ix)]!r}, got {got[tuple(ix)]!r}"
                      for ix in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return f"{len(bad)} of {want.size} elements differ: {shown}{more}"


def run(name: str, target: str, device=None) -> Record:
    """Case ``name`` on ``target`` (a device id; "interp" for the reference interpreter) through
    ``tile.onnx.Backend``; ``device`` is its HAL device (None for the interpreter)."""
    from tile.errors import TileDeviceError, TileError
    from tile.onnx import Backend
    from tile.onnx.errors import TileOnnxUnsupported, TileOnnxValueDependent

    case = cases()[name]
    start = time.perf_counter()

    def done(status: str, reason: str = "") -> Record:
        if status == "failed" and name in KNOWN:
            status, reason = "expected", f"{KNOWN[name][0]}: {KNOWN[name][1]} (was: {reason})"
        return Record(name, operator(case), dtype_of(case), target, status, reason,
                      time.perf_counter() - start)

    why = lacking(case) or target_lacks(case, device)
    if why is not None:
        return done("unsupported", why)
    inputs, expected = case.data_sets[0]
    inputs = [_array(v) for v in inputs]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            prepared = Backend.prepare(case.model, target)
            got = prepared.run(inputs)
    except (TileOnnxUnsupported, TileOnnxValueDependent) as e:
        return done("unsupported", e.message)
    except TileDeviceError as e:
        return done("unsupported", e.message)
    except TileError as e:
        return done("failed", f"{type(e).__name__}: {e.message}")
    except Exception as e:  # a raw exception escaping tile.onnx is a bug of its own
        return done("failed", f"raised {type(e).__name__}: {e}")
    got = list(got)
    if len(got) != len(expected):
        return done("failed", f"{len(got)} outputs, expected {len(expected)}")
    verdicts = [judge(out.name, _array(want), have, case.rtol, case.atol)
                for out, want, have in zip(case.model.graph.output, expected, got)]
    for status in ("failed", "expected"):
        found = [why for v, why in filter(None, verdicts) if v == status]
        if found:
            return done(status, "; ".join(found))
    return done("passed")


def judge(name: str, want, got, rtol: float, atol: float) -> tuple[str, str] | None:
    """None where output ``name`` matches; else ("failed", why) or, for a float16 or bfloat16
    output within ``ROUNDINGS`` units of its roundoff, ("expected", why)."""
    problem = differs(want, got, rtol, atol)
    if problem is None:
        return None
    why = f"{name}: {problem} (rtol {rtol}, atol {atol})"
    dtype = np.asarray(want).dtype.name
    u = NARROW.get(dtype)
    if u is None or differs(want, got, max(rtol, ROUNDINGS * u), atol) is not None:
        return "failed", why
    return "expected", (f"difference: {dtype} rounded at other steps, within {ROUNDINGS} units of "
                        f"roundoff (docs/semantics.md §13): {why}")


# ------------------------------------------------------------------------------- the summary

STATUSES = ("passed", "failed", "expected", "unsupported")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in rows]


def _counts(records: list[Record], key) -> dict[tuple, Counter]:
    grouped: dict[tuple, Counter] = defaultdict(Counter)
    for r in records:
        grouped[key(r)][r.status] += 1
    return grouped


def rate(counter: Counter) -> str:
    total = sum(counter.values())
    return f"{100.0 * counter['passed'] / total:.1f}%" if total else "-"


def lines(records: list[Record]) -> list[str]:
    """The ONNX node tests' part of the terminal summary: per target the pass rate, per operator
    and dtype the counts, then every failure and unsupported reason (grouped)."""
    if not records:
        return []
    out = ["onnx node tests (passed / failed / expected / unsupported, per target):"]
    head = ("target", *STATUSES, "cases", "pass rate")
    per_target = _counts(records, lambda r: (r.target,))
    out += _table([head] + [(t, *(str(c[s]) for s in STATUSES), str(sum(c.values())), rate(c))
                            for (t,), c in sorted(per_target.items())])
    out.append("onnx node tests per operator and dtype (a row where any case did not pass):")
    rows = [("operator", "dtype", "target", *STATUSES)]
    for (op, dt, t), c in sorted(_counts(records, lambda r: (r.operator, r.dtype, r.target)).items()):
        if c["passed"] != sum(c.values()):
            rows.append((op, dt, t, *(str(c[s]) for s in STATUSES)))
    out += _table(rows) if len(rows) > 1 else ["  (every case passed)"]
    for status in ("failed", "expected", "unsupported"):
        for r in sorted((r for r in records if r.status == status), key=lambda r: (r.target, r.case)):
            out.append(f"onnx {status} on {r.target}: {r.case} ({r.operator}, {r.dtype}): {r.reason}")
    return out


def summary(records: list[Record]) -> dict:
    """The same as data, for ``--conformance-json``: per target, per operator/dtype/target, and
    every case that did not pass with its reason."""
    per_target = _counts(records, lambda r: (r.target,))
    per_op = _counts(records, lambda r: (r.operator, r.dtype, r.target))
    return {
        "targets": [{"target": t, **{s: c[s] for s in STATUSES}, "cases": sum(c.values())}
                    for (t,), c in sorted(per_target.items())],
        "operators": [{"operator": op, "dtype": dt, "target": t, **{s: c[s] for s in STATUSES}}
                      for (op, dt, t), c in sorted(per_op.items())],
        "cases": [asdict(r) for r in records if r.status != "passed"],
    }
