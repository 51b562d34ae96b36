"""Checks a program gets before it has inputs: what ``tile.compile`` refuses at once, and warnings.

``early_check`` raises the errors ``python -m tile check`` finds without shapes that hold for any
input shapes and dtypes: misspelled builtins, undefined names, names used before they are defined.
Type and shape errors of the symbolic check are not raised there: they may depend on the dtypes
and sizes the first call brings (``A & B`` is fine on integers, and ``N`` may equal ``M``).

``index_warnings`` finds contractions whose output has an index that no operand uses while an
operand's index is summed, ``C[i, q: M, N] = +(A[i, k] * B[k, j])``: legal (``q`` broadcasts,
``j`` is summed away), and almost always a typo. ``warn`` gives each as a ``TileIndexWarning``,
once per program text and place.
"""

from __future__ import annotations

import warnings

from tile import ast
from tile.errors import TileError, TileIndexWarning, TileNameError, unknown_function, unknown_name

_SEEN: dict = {}  # the warnings registry of ``warn``: each warning once per text and place


def early_check(program: ast.Program) -> None:
    """Raise the ``TileNameError`` the symbolic check (``tile check``) raises, if any; where it
    stops earlier at a type or shape error that the real inputs may not have, look for unknown
    functions and names without types."""
    from tile.bind import bind_symbolic  # (imports sympy: only when a program is checked)

    try:
        bind_symbolic(program)
    except TileNameError:
        raise
    except TileError:
        _names(program)


def _names(program: ast.Program) -> None:
    """Unknown functions and names, statement by statement, as the binder words them."""
    known = {i.name for i in program.inputs}
    known |= {d for i in program.inputs for d in (i.dims or ())}
    later = {s.name: s.span for s in program.stmts}
    for stmt in program.stmts:
        for e in ast.expressions(stmt):
            if isinstance(e, ast.Call) and not e.fn.startswith("assert_"):  # (tile.asserts: sympy)
                _function(e)
            elif isinstance(e, ast.Name) and not e.is_index and e.name not in known:
                _unknown(e.name, e, known, later)
        if isinstance(stmt, ast.Contraction):
            for ref in stmt.operands:
                if ref.name not in known:
                    _unknown(ref.name, ref, known, later)
        known.add(stmt.name)


def _function(call: ast.Call) -> None:
    from tile.builtins import BUILTINS

    if call.fn not in BUILTINS:
        raise unknown_function(call.fn, call.span, BUILTINS)


def _unknown(name: str, node: ast.Name | ast.TensorRef, known: set[str], later: dict) -> None:
    raise unknown_name(name, node.span, sorted(known), later)


def _index_names(exprs) -> list[ast.Name]:
    out = []
    for root in exprs:
        stack = [root]
        while stack:
            e = stack.pop()
            if isinstance(e, ast.Name) and e.is_index:
                out.append(e)
            stack.extend(ast.children(e))
    return out


def index_warnings(program: ast.Program) -> list[TileIndexWarning]:
    """One warning per contraction with a free output index (used by no operand and no
    constraint) while an index of a single operand is summed: the likely typo."""
    found = []
    for stmt in program.stmts:
        if not isinstance(stmt, ast.Contraction):
            continue
        out = _index_names(stmt.output.indices)
        used = {n.name for ref in stmt.operands for n in _index_names(ref.indices)}
        used |= {n.name for c in stmt.constraints for n in _index_names([c.poly])}
        free = [n for n in out if n.name not in used]
        outs = {n.name for n in out}
        per_operand = [{n.name for n in _index_names(ref.indices)} for ref in stmt.operands]
        summed = sorted(
            {x for names in per_operand for x in names if x not in outs}
            & {x for x in used if sum(x in names for names in per_operand) == 1}
        )
        if not free or not summed:
            continue
        q, j = free[0], summed[0]
        also = f" (and {', '.join(repr(s) for s in summed[1:])})" if len(summed) > 1 else ""
        found.append(
            TileIndexWarning(
                f"output index '{q.name}' of '{stmt.name}' is used by no operand, while '{j}'{also} "
                f"is summed: '{stmt.name}' repeats one sum along '{q.name}'",
                q.span,
                hint=f"if you meant '{j}', write it in the output; if the repeat is meant, silence this "
                "with warnings.filterwarnings('ignore', category=tile.TileIndexWarning)",
            )
        )
    return found


def warn(program: ast.Program) -> None:
    """Give ``index_warnings`` through ``warnings`` (filters apply), each once per text and place."""
    for w in index_warnings(program):
        span = w.span
        name = span.source.name if span is not None and span.source is not None else "<string>"
        warnings.warn_explicit(w, TileIndexWarning, name, span.line if span else 0, "tile", _SEEN)
