"""Printing a bound program at any stage: Tile syntax, with flat contractions as tables."""

from __future__ import annotations

from tile.errors import TileIndexError
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


def format_flat_program(bound: BoundProgram) -> str:
    """The flat stage as a runnable Tile program: every tensor a flat contraction touches is viewed
    as 1-D (``A_1d = reshape(A, n)``), each contraction indexes those views with its offsets and
    strides under its remaining constraints, and its result is reshaped back (a scalar result is
    assigned from its one element, since ``reshape`` has no rank-0 form). It computes what the
    source computes, which is what the conformance suite's ``flat`` family checks on every target.
    A flat contraction with an index that only its constraints use (a defract digit that no
    stride reads) has no Tile spelling: that raises ``TileIndexError``.
    ``bound`` must be at the flat stage (``apply_stage(bound, "flat")``)."""
    from tile.printer import format_program
    from tile.transforms.flat import as_contraction

    taken = set(bound.types) | {n for n, _ in bound.inputs}

    def fresh(name: str) -> str:
        view = f"{name}_1d"
        while view in taken:
            view += "_"
        taken.add(view)
        return view

    views: dict[str, str] = {}
    lines = [format_program(bound.program).splitlines()[0]]

    def view(name: str) -> str:
        if name not in views:
            views[name] = fresh(name)
            n = 1
            for d in bound.types[name].shape:
                n *= d
            lines.append(f"    {views[name]} = reshape({name}, {n});")
        return views[name]

    for ast_stmt, stmt in zip(bound.program.stmts, bound.stmts):
        if not isinstance(stmt, FlatContraction):
            lines.append("    " + format_statement(ast_stmt))
            continue
        accesses = (stmt.output, *stmt.operands)
        hidden = [n for k, n in enumerate(stmt.names) if not any(a.strides[k] for a in accesses)]
        if hidden:
            raise TileIndexError(
                f"the flat form of '{stmt.name}' has an index ({', '.join(hidden)}) that only its "
                "constraints use, which Tile syntax cannot state",
                stmt.span,
                hint="print it with --stage flat (the table) instead; backends run it as it is",
            )
        c = as_contraction(stmt)
        out = fresh(c.name)
        renamed = TContraction(
            out,
            c.type,
            c.agg,
            c.comb,
            TAccess(out, c.output.polys, c.output.type),
            tuple(TAccess(view(a.tensor), a.polys, a.type) for a in c.operands),
            c.constraints,
            None if c.default is None else view(c.default),
            c.no_defract,
        )
        lines.append("    " + format_contraction(renamed))
        if stmt.type.shape:
            lines.append(f"    {c.name} = reshape({out}, {', '.join(map(str, stmt.type.shape))});")
        else:  # reshape has no rank-0 form; a scalar is the one element, assigned
            lines.append(f"    {c.name}[] = =({out}[0]);")
    lines.append("}")
    return "\n".join(lines) + "\n"
