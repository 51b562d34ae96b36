"""Stripe's text format: ``format_block`` prints a Block tree, ``stripe.parser`` reads it back.

The layout follows what PlaidML's ``stripe.cc`` printed (the slides), extended so that every
field of ``stripe.ir`` is written and ``parse_stripe(format_block(b)) == b`` holds for every
block::

    0: #program block [] ( // conv
        #input #user none I[0, 0] fp32(4:3, 3:1)
    ) {
      0: #main block [] ( // main
          in I[0, 0] fp32(4:3, 3:1)
          out O[0, 0]:assign fp32(4:3, 3:1)
      ) {
        0: #eltwise #kernel block<GPU[0]> [i:4, j:3] ( // O
            // O = exp(I)
            in I[i, j] fp32(1:3, 1:1)
            out O[i, j] fp32(1:3, 1:1)
        ) {
          0: $I = load(I)
          1: $O = exp($I):fp32
          2: O = store($O)
        }
      }
    }

Grammar (whitespace and line breaks are free, except that ``//`` starts a comment running to the
end of its line; a ``;`` after a statement is optional, as in the slides)::

    program  := [INT ':'] block
    block    := {mark} 'block' [loc] '[' [index {',' index}] ']'
                '(' [NAMECOMMENT] {COMMENT | plan | affine '>=' '0' | ref} ')' '{' {INT ':' stmt [';']} '}'
    plan     := 'plan' name '(' [field {',' field}] ')'   at most one, after the comments
    field    := name ':' (int | name | 'true' | 'false' | '[' [item {',' item}] ']'),  item := name [':' int]
    mark     := '#' name ['=' value]              tags (sorted), then attrs (in order)
    index    := name ':' int ['=' affine]         the affine is of the enclosing block's indexes
    ref      := {'#' name} dir [loc] ['const'] [OFFSET] name ['=' name]
                '[' [affine {',' affine}] ']' [':' name] DTYPE '(' [int ':' int {',' int ':' int}] ')'
    dir      := 'none' | 'in' | 'out' | 'inout'
    loc      := '<' [name] ['[' affine {',' affine} ']'] '>'
    stmt     := block
              | name '=' 'load' '(' name ')'  |  name '=' 'store' '(' name ')'
              | name '=' 'load_index' '(' affine ')'
              | name '=' '(' DTYPE ')' number
              | [name {',' name} '='] name '(' args ')' [':' DTYPE]   Intrinsic if typed, else Special
    args     := names, then ints, then strings, comma-separated (inputs, int params, str params)
    affine   := ['-'] term {('+' | '-') term},  term := INT ['/' INT] ['*' name] | name
    value    := int | float | string | 'true' | 'false';  number := int | float | 'true' | 'false'

* ``NAMECOMMENT`` is a comment on the line of the ``(``: the block's name. Other comments in the
  header are the block's ``comments``; comments elsewhere are ignored.
* A ref prints ``into = from`` whenever ``from_`` is set (even to ``into`` itself), ``:agg_op``
  when it is not empty, and ``DTYPE(size:stride, ...)`` with the short names of ``ir.DTYPE_NAMES``.
* ``plan`` is the block's ``stripe.plans`` plan: its kind (``gemm``, ``row``, ``combine``,
  ``transpose``) and its fields in order, names as names, lists of index names with their tiles or
  extents as ``[i0:64, i1:4]``, e.g. ``plan row(rows: [i], values: [Mx_row, S_row], group: 512)``,
  ``plan transpose(rows: m, cols: n, src: C, out: D, tile: 32)``.
* ``OFFSET`` is ``@0x`` and lowercase hex digits (``@0x1c0``): a refinement's placement ``offset``
  in bytes, written only when it is set.
* A name is ``[A-Za-z_$][A-Za-z0-9_$']*``; any other string, or a keyword (``block none in out
  inout const load store load_index plan``), is written between backticks with JSON escapes
  (`` `my name` ``), so every string round-trips. Function names are quoted the same way, so a
  Special called ``load`` is `` `load`(...) `` and cannot be mistaken for a Load.
* Strings (str params, attr values) are JSON strings. Floats are ``repr`` (``1.5``, ``1e-07``,
  ``inf``, ``nan``), which reads back to the same double; ints have no dot, bools are
  ``true``/``false``.
* A comment or block name prints verbatim unless it is not printable, has surrounding whitespace or
  starts with ``"``; then it is a JSON string.
* Affines print like ``str(Affine)`` (``-1 + kx + x``, ``1/3*v``), quoting odd variable names.
"""

from __future__ import annotations

import functools
import json
import numbers
import re

import numpy as np

from stripe import plans
from stripe.ir import (
    DTYPE_NAMES,
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    Location,
    Refinement,
    Special,
    Statement,
    Store,
)
from stripe.plans import Plan
from tile.affine import Affine

KEYWORDS = frozenset({"block", "none", "in", "out", "inout", "const", "load", "store", "load_index", "plan"})
NAME_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$']*")


@functools.lru_cache(maxsize=1 << 14)
def fmt_name(name: str) -> str:
    """A name as written: bare when it is a plain identifier and not a keyword, else quoted. Kept
    per name, as ``fmt_affine`` per affine: a long program prints the same few thousand many times
    (the LLVM device's kernel keys, ``backends.llvm.dedup``)."""
    if NAME_RE.fullmatch(name) and name not in KEYWORDS:
        return name
    return "`" + json.dumps(name)[1:-1].replace("`", "\\u0060") + "`"


def fmt_text(text: str) -> str:
    """A block name or comment: verbatim when that reads back unchanged, else a JSON string."""
    if text.isprintable() and text == text.strip() and not text.startswith('"'):
        return text
    return json.dumps(text)


def fmt_comment(text: str) -> str:
    return "// " + fmt_text(text) if text else "//"


@functools.lru_cache(maxsize=1 << 14)
def fmt_affine(a: Affine) -> str:
    """``str(a)`` with quoted names where needed: ``-1 + kx + x``, ``1/3*v - 2``."""
    parts: list[tuple[str, str]] = []
    for k, v in a.terms:
        mag = abs(v)
        name = fmt_name(k)
        parts.append(("-" if v < 0 else "+", name if mag == 1 else f"{mag}*{name}"))
    if a.const != 0 or not parts:
        parts.append(("-" if a.const < 0 else "+", str(abs(a.const))))
    text = " ".join(f"{sign} {body}" for sign, body in parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def fmt_value(value: int | float | str | bool) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    assert isinstance(value, numbers.Real), f"not a Stripe value: {value!r}"
    return repr(float(value))  # the shortest spelling that reads back to the same double


def fmt_location(loc: Location | None) -> str:
    if loc is None:
        return ""
    name = fmt_name(loc.name) if loc.name else ""
    units = f"[{', '.join(fmt_affine(u) for u in loc.units)}]" if loc.units else ""
    return f"<{name}{units}>"


def fmt_ref(r: Refinement) -> str:
    parts = [f"#{fmt_name(t)}" for t in sorted(r.tags)]
    parts.append(r.dir.value + fmt_location(r.location))
    if r.is_const:
        parts.append("const")
    if r.offset is not None:
        assert r.offset >= 0, f"a negative placement offset: {r.offset}"
        parts.append(f"@{r.offset:#x}")
    parts.append(fmt_name(r.into))
    if r.from_ is not None:
        parts += ["=", fmt_name(r.from_)]
    agg = f":{fmt_name(r.agg_op)}" if r.agg_op else ""
    access = f"[{', '.join(fmt_affine(a) for a in r.access)}]{agg}"
    dims = ", ".join(f"{d.size}:{d.stride}" for d in r.shape.dims)
    return " ".join(parts) + f"{access} {DTYPE_NAMES[r.shape.dtype]}({dims})"


def _plan_value(v: object) -> str:
    if isinstance(v, bool):
        return fmt_value(v)
    if isinstance(v, str):
        return fmt_name(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_plan_value(x) if isinstance(x, str) else f"{fmt_name(x[0])}:{x[1]}"
                               for x in v) + "]"
    return str(v)


def fmt_plan(plan: Plan) -> str:
    """``plan KIND(field: value, ...)``: the block's hand-off (``stripe.plans``)."""
    body = ", ".join(f"{name}: {_plan_value(v)}" for name, v in plans.items(plan))
    return f"plan {plans.kind(plan)}({body})"


def _call(outputs: tuple[str, ...], name: str, args: list[str], suffix: str = "") -> str:
    lhs = ", ".join(fmt_name(o) for o in outputs)
    return (f"{lhs} = " if outputs else "") + f"{fmt_name(name)}({', '.join(args)}){suffix}"


def fmt_stmt(s: Statement) -> str:
    """One non-block statement, without its ``k:`` prefix."""
    if isinstance(s, Load):
        return f"{fmt_name(s.into)} = load({fmt_name(s.from_)})"
    if isinstance(s, Store):
        return f"{fmt_name(s.into)} = store({fmt_name(s.from_)})"
    if isinstance(s, LoadIndex):
        return f"{fmt_name(s.into)} = load_index({fmt_affine(s.affine)})"
    if isinstance(s, Constant):
        return f"{fmt_name(s.into)} = ({DTYPE_NAMES[s.dtype]}){fmt_value(s.value)}"
    if isinstance(s, Intrinsic):
        args = [fmt_name(i) for i in s.inputs] + [str(p) for p in s.params]
        return _call(s.outputs, s.name, args, f":{DTYPE_NAMES[s.dtype]}")
    if isinstance(s, Special):
        args = [fmt_name(i) for i in s.inputs] + [str(p) for p in s.int_params]
        return _call(s.outputs, s.name, args + [json.dumps(p) for p in s.str_params])
    raise AssertionError(f"not a Stripe statement: {s!r}")


def _block(b: Block, indent: int, prefix: str, out: list[str]) -> None:
    pad = " " * indent
    marks = [f"#{fmt_name(t)}" for t in sorted(b.tags)]
    marks += [f"#{fmt_name(k)}={fmt_value(v)}" for k, v in b.attrs]
    idxs = ", ".join(
        f"{fmt_name(i.name)}:{i.range}" + ("" if i.affine is None else f" = {fmt_affine(i.affine)}")
        for i in b.idxs
    )
    head = " ".join([*marks, "block" + fmt_location(b.location)]) + f" [{idxs}] ("
    out.append(pad + prefix + head + (f" {fmt_comment(b.name)}" if b.name else ""))
    inner = " " * (indent + 4)
    out.extend(inner + fmt_comment(c) for c in b.comments)
    if b.plan is not None:
        out.append(inner + fmt_plan(b.plan))
    out.extend(f"{inner}{fmt_affine(c)} >= 0" for c in b.constraints)
    out.extend(inner + fmt_ref(r) for r in b.refs)
    out.append(pad + ") {")
    for k, s in enumerate(b.stmts):
        if isinstance(s, Block):
            _block(s, indent + 2, f"{k}: ", out)
        else:
            out.append(f"{pad}  {k}: {fmt_stmt(s)}")
    out.append(pad + "}")


def format_block(block: Block) -> str:
    """The block tree as text (ending in a newline); ``stripe.parser.parse_stripe`` inverts it."""
    out: list[str] = []
    _block(block, 0, "0: ", out)
    return "\n".join(out) + "\n"


format_program = format_block

__all__ = [
    "KEYWORDS", "fmt_affine", "fmt_name", "fmt_plan", "fmt_ref", "fmt_stmt", "format_block", "format_program",
]
