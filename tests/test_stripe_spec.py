"""docs/stripe.md is kept true by checking it against the implementation.

* Its intrinsic table lists exactly the intrinsics the IR (``stripe.verify``) and the evaluator
  (``ref_interp.stripe_exec``) both accept, with their arity and parameter counts, and every example
  of the table (``sub(i32 7, i32 10):i32 = -3``) is run through the evaluator: a wrong argument
  order or a wrong value fails.
* Its special table lists exactly the specials ``stripe.specials`` knows, with their input counts.
* Its element-type table lists every ``ir.DTYPE_NAMES`` entry with its long name and size.
* Every node class of ``stripe.ir`` (every statement kind, the refinement and its parts) has a
  section naming each of its fields; every ``RefDir`` and ``agg_op`` is described; every Stripe
  stage of the HAL is described.
* Every worked example is what ``python -m tile emit`` prints now. After an intended change of the
  printer or of lowering, ``python tests/test_stripe_spec.py --update`` rewrites them (never
  silently).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from ref_interp.elementwise import IMPLS
from ref_interp.stripe_exec import run_stripe
from stripe import ir
from stripe.parser import parse_stripe
from stripe.specials import _RULES, AGG_INIT, STRUCTURAL
from tile.builtins import BUILTINS

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "stripe.md"


# ------------------------------------------------------------------------ reading the document
def section(text: str, heading: str) -> str:
    """The text under the heading that starts with ``heading``, up to the next heading of its level
    or above."""
    m = re.search(rf"^(#+) {re.escape(heading)}.*$", text, re.M)
    assert m, f"docs/stripe.md has no heading starting {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[m.end() :], re.M)
    return text[m.end() : m.end() + end.start() if end else len(text)]


def table(text: str) -> list[list[str]]:
    """The rows of the first markdown table in ``text`` (header and rule dropped), cells stripped."""
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(rows) > 2, "no table"
    return [[c.strip() for c in re.split(r"(?<!\\)\|", r)[1:-1]] for r in rows[2:]]


def code(cell: str) -> str:
    m = re.fullmatch(r"`([^`]+)`", cell)
    assert m, f"expected one `code` cell, got {cell!r}"
    return m.group(1)


def names(cell: str) -> list[str]:
    """``a, b`` -> [a, b]; ``—`` -> []; ``width (16, 32)`` -> [width]."""
    if cell == "—":
        return []
    return re.findall(r"`([^`]+)`", cell)[0].split(", ") if "`" in cell else []


SPEC_TEXT = SPEC.read_text(encoding="utf-8")


# ------------------------------------------------------------------------ intrinsics
def accepted_intrinsics() -> set[str]:
    """What both ``stripe.verify`` (a builtin name, or assign) and the evaluator (an elementwise
    implementation that is not a whole-tensor builtin) accept as an Intrinsic."""
    return {n for n in BUILTINS if n in IMPLS and n not in STRUCTURAL} | {"assign"}


INTRINSIC_ROWS = table(section(SPEC_TEXT, "9. Intrinsics"))


def test_the_intrinsic_table_lists_exactly_what_the_ir_and_the_evaluator_accept():
    listed = [code(r[0]) for r in INTRINSIC_ROWS]
    assert len(listed) == len(set(listed)), "a repeated row"
    want = accepted_intrinsics()
    missing, unknown = sorted(want - set(listed)), sorted(set(listed) - want)
    assert not missing and not unknown, f"missing: {missing}; unknown: {unknown}"


@pytest.mark.parametrize("row", INTRINSIC_ROWS, ids=lambda r: code(r[0]))
def test_each_intrinsic_row_has_the_builtins_arity_and_parameter_count(row):
    name = code(row[0])
    tensors, params = (1, 0) if name == "assign" else (BUILTINS[name].tensors, BUILTINS[name].params)
    assert len(names(row[1])) == tensors, f"{name}: inputs {row[1]}, the builtin takes {tensors}"
    assert len(names(row[2])) == params, f"{name}: params {row[2]}, the builtin takes {params}"
    assert re.findall(r"`([a-z_0-9]+)\(", row[5]), f"{name} has no example"


_EXAMPLE = re.compile(r"`([a-z_0-9]+)\(([^)]*)\):([a-z0-9]+) = ([^`]+)`")


def _value(text: str):
    return {"true": True, "false": False}.get(text, None) if text in ("true", "false") else float(text)


def _run_example(name: str, args: str, result_dtype: str) -> np.ndarray:
    """``name(args):result_dtype`` through the Stripe evaluator: each typed operand an input buffer
    of its dtype, loaded and passed to the intrinsic; the result stored into a 0-D output."""
    operands, params = [], []
    for a in args.split(", "):
        parts = a.split(" ")
        if len(parts) == 2:
            operands.append((parts[0], parts[1]))
        else:
            params.append(int(a))
    roots = [f"#input #user none a{k}[] {dt}()" for k, (dt, _) in enumerate(operands)]
    roots.append(f"#output #user none O[] {result_dtype}()")
    mains = [f"in a{k}[] {dt}()" for k, (dt, _) in enumerate(operands)] + [f"out O[] {result_dtype}()"]
    loads = [f"{k}: $a{k} = load(a{k})" for k in range(len(operands))]
    n = len(loads)
    call = ", ".join([f"$a{k}" for k in range(len(operands))] + [str(p) for p in params])
    text = "\n".join(
        ["0: #program block [] (", *roots, ") {", "0: #main block [] (", *mains, ") {",
         "0: #kernel block [] (", *[m.replace("out O[]", "out O[]:assign") for m in mains], ") {",
         *loads, f"{n}: $r = {name}({call}):{result_dtype}", f"{n + 1}: O = store($r)", "}", "}", "}"]
    )  # fmt: skip
    program = parse_stripe(text)
    inputs = {
        f"a{k}": np.array(_value(v), dtype=ir.DTYPES_BY_NAME[dt].numpy) for k, (dt, v) in enumerate(operands)
    }
    return run_stripe(program, inputs)["O"]


def _same(got: np.ndarray, want: str) -> bool:
    g = got.item() if got.dtype.kind in "biu" else float(got)
    if want in ("true", "false"):
        return g is (want == "true")
    w = float(want)
    if math.isnan(w):
        return isinstance(g, float) and math.isnan(g)
    return g == w and math.copysign(1, g) == math.copysign(1, w)


@pytest.mark.parametrize("row", INTRINSIC_ROWS, ids=lambda r: code(r[0]))
def test_each_intrinsic_example_is_what_the_evaluator_computes(row):
    examples = _EXAMPLE.findall(row[5])
    assert examples and 2 * len(examples) == row[5].count("`"), f"unreadable examples: {row[5]}"
    for name, args, dt, want in examples:
        assert name == code(row[0]), f"an example of {name} in the row of {row[0]}"
        got = _run_example(name, args, dt)
        assert got.dtype == ir.DTYPES_BY_NAME[dt].numpy
        assert _same(got, want), f"{name}({args}):{dt} gives {got!r}, docs/stripe.md says {want}"


def test_a_wrong_example_is_caught():
    """The example check can fail: argument order and values are really compared."""
    assert _same(_run_example("sub", "i32 7, i32 10", "i32"), "-3")
    assert not _same(_run_example("sub", "i32 10, i32 7", "i32"), "-3")
    assert not _same(_run_example("max", "fp32 0.0, fp32 -0.0", "fp32"), "0.0")


# ------------------------------------------------------------------------ specials
def test_the_special_table_lists_exactly_the_known_specials_with_their_input_counts():
    rows = table(section(SPEC_TEXT, "10. Specials"))
    listed = {code(r[0]): r for r in rows}
    fills = {"zero"} | {f"agg_init_{op}" for op in AGG_INIT}
    assert set(listed) == fills | set(_RULES)
    for name, row in listed.items():
        inputs = re.findall(r"`([^`]+)`", row[1])
        if name in fills:
            assert row[1] == "—" and row[2] == "`O, ...`", name
            continue
        required = re.sub(r"\[.*?\]", "", inputs[0]).split(", ")
        optional = re.findall(r"\[, (\w+)\]", inputs[0])
        counts = set(range(len(required), len(required) + len(optional) + 1))
        n_in, n_out, _ = _RULES[name]
        assert counts == set(n_in), f"{name}: the table says {sorted(counts)} inputs, the rules {n_in}"
        assert len(re.findall(r"`([^`]+)`", row[2])[0].split(", ")) == n_out, name


# ------------------------------------------------------------------------ dtypes, nodes, stages
def test_every_dtype_name_is_listed_with_its_long_name_and_size():
    rows = table(section(SPEC_TEXT, "4. Element types"))
    listed = {code(r[0]): (code(r[1]), int(r[2])) for r in rows}
    assert set(listed) == set(ir.DTYPE_NAMES.values())
    for dt, short in ir.DTYPE_NAMES.items():
        assert listed[short] == (dt.value, np.dtype(dt.numpy).itemsize), short


NODES = (ir.Block, ir.Index, ir.Refinement, ir.TensorShape, ir.Dim, ir.Location)
NODES += typing.get_args(ir.Statement)


@pytest.mark.parametrize("cls", sorted(set(NODES), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_node_class_has_a_section_naming_each_field(cls):
    text = "".join(
        section(SPEC_TEXT, h) for h in re.findall(rf"^#+ (`{cls.__name__}`.*)$", SPEC_TEXT, re.M)
    )
    assert text, f"docs/stripe.md has no section `{cls.__name__}`"
    spans = " ".join(re.findall(r"`([^`]+)`", text))
    for f in dataclasses.fields(cls):
        assert re.search(rf"(?<![\w]){re.escape(f.name)}(?![\w])", spans), f"{cls.__name__}.{f.name}"


def test_every_direction_aggregation_and_stripe_stage_is_described():
    dirs = section(SPEC_TEXT, "`RefDir`")
    assert all(f"`{d.value}`" in dirs for d in ir.RefDir)
    rows = table(section(SPEC_TEXT, "Aggregation"))
    described = {"" if r[0].startswith("(empty") else code(r[0]) for r in rows}
    assert described == set(ir.AGG_OPS)
    from backends.hal import STAGES

    stages = section(SPEC_TEXT, "2. Stages")
    assert all(f"**`{s}`**" in stages for s in STAGES if s != "tile")


def test_the_protocol_and_architecture_docs_link_the_spec():
    for doc in ("new_target.md", "external_protocol.md", "architecture.md"):
        assert "stripe.md" in (ROOT / "docs" / doc).read_text(encoding="utf-8"), doc


# ------------------------------------------------------------------------ worked examples
_EMIT = re.compile(
    r"^`python -m tile emit (\S+\.tile) ([^`]*)` prints:\n\n```stripe\n(.*?)```\n", re.M | re.S
)
_TILE = re.compile(r"^```tile\n(.*?)```\n", re.M | re.S)


def examples(text: str) -> list[tuple[re.Match, str]]:
    """Each emit example with the Tile source of its file: the ``tile`` block after the previous
    example, else the file named earlier."""
    files: dict[str, str] = {}
    out, last = [], 0
    for m in _EMIT.finditer(text):
        blocks = _TILE.findall(text, last, m.start())
        if blocks:
            files[m.group(1)] = blocks[-1]
        assert m.group(1) in files, f"no Tile source for {m.group(1)}"
        out.append((m, files[m.group(1)]))
        last = m.end()
    return out


def emitted(source: str, filename: str, args: str, folder: Path) -> str:
    from tile.cli import main

    path = folder / filename
    path.write_text(source, encoding="utf-8")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["emit", str(path), *args.split()]) == 0
    return buf.getvalue()


def test_the_document_has_worked_examples_of_both_stripe_stages():
    found = examples(SPEC_TEXT)
    assert len(found) >= 5
    assert {re.search(r"--stage (\S+)", m.group(2)).group(1) for m, _ in found} == {"stripe", "optimized"}


@pytest.mark.parametrize("k", range(len(examples(SPEC_TEXT))))
def test_each_worked_example_is_what_the_printer_prints(k, tmp_path):
    m, source = examples(SPEC_TEXT)[k]
    want = emitted(source, m.group(1), m.group(2), tmp_path)
    assert m.group(3) == want, (
        f"the example of `{m.group(1)} {m.group(2)}` is stale: run python tests/test_stripe_spec.py --update"
    )
    assert parse_stripe(want) is not None


def update(folder: Path) -> None:
    """Rewrite every worked example with what the printer prints now."""
    text = SPEC_TEXT
    for m, source in reversed(examples(text)):
        body = emitted(source, m.group(1), m.group(2), folder)
        text = text[: m.start(3)] + body + text[m.end(3) :]
    SPEC.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_stripe_spec.py --update   (rewrites docs/stripe.md's examples)")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        update(Path(d))
    print(f"updated {SPEC}")
