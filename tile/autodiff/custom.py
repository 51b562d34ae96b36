"""User-written gradients, used instead of the derived ones.

``grad(program, custom={"T": source})`` replaces the derived gradient of statement ``T`` by a Tile
function the user wrote::

    function (X, T, DT) -> (DX) {      // any tensors of the program, and DT, the adjoint of T
        DX = DT * 2;                   // one output D<X> per tensor X that T reads
    }

Its inputs are matched by name: ``D<T>`` is T's adjoint, every other input is the program's
tensor of that name (dims declared on them stand for that tensor's sizes). Each output must be
named ``D<X>`` for a float tensor ``X`` that statement ``T`` reads. Its statements are inlined with
fresh names, so the custom gradient composes with the derived ones, and a second derivative
differentiates through it like any other code.
"""

from __future__ import annotations

from tile import ast
from tile.autodiff.build import size_expr
from tile.autodiff.simplify import used_names
from tile.bind import bind
from tile.errors import TileNameError, TileShapeError
from tile.parser import parse
from tile.shapes import fmt_shape, same_size


def inline_custom(rev, stmt: ast.Statement, source: str | ast.Program, g: str) -> list[tuple[str, ast.Expr]]:
    """Emit the custom gradient of ``stmt`` (adjoint ``g``) and return its contributions."""
    fn = parse(source, f"<custom gradient of {stmt.name}>") if isinstance(source, str) else source
    reads = {n for n in used_names(stmt) if n in rev.types and rev.types[n].dtype.is_float}
    adjoint_param = f"D{stmt.name}"
    subst: dict[str, ast.Expr] = {}
    for inp in fn.inputs:
        if inp.name == adjoint_param:
            target = stmt.name  # the adjoint has the statement's shape
            subst[inp.name] = ast.Name(g)
        elif inp.name in rev.types:
            target = inp.name
            subst[inp.name] = ast.Name(inp.name)
        else:
            raise TileNameError(
                f"the custom gradient of '{stmt.name}' takes '{inp.name}', which is neither a tensor of the "
                f"program nor {adjoint_param}",
                inp.span,
                hint=f"name its inputs after the program's tensors, and the adjoint {adjoint_param}",
            )
        shape = rev.types[target].shape
        for k, dim in enumerate(inp.dims or ()):
            if shape is not None and k < len(shape):
                subst.setdefault(dim, size_expr(shape[k]))
    outputs = {}
    for out in fn.outputs:
        x = out.name[1:] if out.name.startswith("D") else None
        if x is None:
            raise TileNameError(
                f"the custom gradient of '{stmt.name}' returns '{out.name}', which is not named D<X>",
                out.span,
                hint=f"name each output D<X> after a tensor X read by {stmt.name}: "
                f"{', '.join('D' + r for r in sorted(reads)) or '(none)'}",
            )
        if x not in reads:
            raise TileNameError(
                f"the custom gradient of '{stmt.name}' returns '{out.name}', but '{stmt.name}' reads "
                f"no float tensor '{x}'",
                out.span,
                hint=f"return D<X> for tensors X read by {stmt.name}: "
                f"{', '.join('D' + r for r in sorted(reads)) or '(none)'}",
            )
        outputs[out.name] = x
    _check_shapes(rev, stmt, fn, outputs)
    for s in fn.stmts:
        new = rev.namer.fresh(f"{s.name}_{stmt.name}" if s.name in outputs else s.name)
        subst[s.name] = ast.Name(new)
        rev.emit(ast.rename_statement(s, subst))
    return [(x, subst[o]) for o, x in outputs.items()]


def _check_shapes(rev, stmt: ast.Statement, fn: ast.Program, outputs: dict[str, str]) -> None:
    """Each returned gradient must have exactly the shape of the tensor it belongs to."""
    adjoint_param = f"D{stmt.name}"
    given = {i.name: rev.types[stmt.name if i.name == adjoint_param else i.name] for i in fn.inputs}
    types = bind(fn, given).types
    for out in fn.outputs:
        want = rev.types[outputs[out.name]].shape
        got = types[out.name].shape
        if want is None or got is None:
            continue
        if len(want) != len(got) or not all(same_size(a, b) for a, b in zip(want, got)):
            raise TileShapeError(
                f"the custom gradient '{out.name}' has shape {fmt_shape(got)} but '{outputs[out.name]}' has "
                f"shape {fmt_shape(want)}",
                out.span,
                hint="a gradient has the shape of its tensor",
            )
