"""Printing a bound program at any stage: Tile syntax, with flat contractions as tables."""

from __future__ import annotations

from tile.printer import format_combination, format_statement
from tile.transforms.flat import FlatContraction, format_flat
from tile.typed import BoundProgram, TAccess, TContraction


def _ref(a: TAccess) -> str:
    return f"{a.tensor}[{', '.join(str(p) for p in a.polys)}]"


def format_contraction(c: TContraction) -> str:
    """A contraction in Tile syntax, with its (concrete) output sizes."""
    idx = ", ".join(str(p) for p in c.output.polys)
    sizes = ", ".join(str(d) for d in c.type.shape)
    out = f"{c.name}[{idx}: {sizes}]" if c.output.polys else f"{c.name}[]"
    text = f"{out} = {c.agg.value}({format_combination(c.comb, [_ref(o) for o in c.operands])})"
    for k in c.constraints:
        text += f", {k.poly} < {k.bound}"
    if c.no_defract:
        text += " no_defract"
    if c.default is not None:
        text += f" default {c.default}"
    return text + ";"


def format_stage(bound: BoundProgram) -> str:
    """The whole program: its header, elementwise statements as written, contractions as they are
    at this stage (flat ones as comment tables, since the flat form is not Tile syntax)."""
    prog = bound.program
    from tile.printer import format_program

    header = format_program(prog).splitlines()[0]
    lines = [header]
    for ast_stmt, stmt in zip(prog.stmts, bound.stmts):
        if isinstance(stmt, FlatContraction):
            lines.extend("    // " + line for line in format_flat(stmt).splitlines())
        elif isinstance(stmt, TContraction):
            lines.append("    " + format_contraction(stmt))
        else:
            lines.append("    " + format_statement(ast_stmt))
    lines.append("}")
    return "\n".join(lines) + "\n"
