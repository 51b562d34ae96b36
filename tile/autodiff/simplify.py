"""Clean-ups that keep generated programs readable: dead statements and needless aliases."""

from __future__ import annotations

import dataclasses

from tile import ast


def expr_names(e: ast.Expr) -> set[str]:
    """Upper-case names an expression reads (tensors, dims, constants)."""
    if isinstance(e, ast.Name):
        return set() if e.is_index else {e.name}
    if isinstance(e, ast.Binary):
        return expr_names(e.lhs) | expr_names(e.rhs)
    if isinstance(e, ast.Unary):
        return expr_names(e.operand)
    if isinstance(e, ast.Ternary):
        return expr_names(e.cond) | expr_names(e.then) | expr_names(e.other)
    if isinstance(e, ast.Call):
        out: set[str] = set()
        for a in e.args:
            out |= expr_names(a)
        return out
    return set()


def used_names(s: ast.Statement) -> set[str]:
    """Every upper-case name a statement reads."""
    if isinstance(s, ast.Assignment):
        return expr_names(s.expr)
    out = {op.name for op in s.operands}
    exprs = [*s.output.indices, *(s.sizes or ()), *(i for op in s.operands for i in op.indices)]
    exprs += [x for c in s.constraints for x in (c.poly, c.bound)]
    for x in exprs:
        out |= expr_names(x)
    if s.default is not None:
        out.add(s.default)
    return out


def dead_code(stmts: list[ast.Statement], outputs: list[str]) -> list[ast.Statement]:
    """Only the statements the outputs need, in their original order. A kept ``prng_step`` keeps
    every statement reading its handle (its ``prng_state`` too), as ``tile.prng`` requires."""
    needed = set(outputs)
    while True:
        keep = []
        for s in reversed(stmts):
            if s.name in needed:
                keep.append(s)
                needed |= used_names(s)
        handles = {s.name for s in keep if isinstance(s, ast.Assignment) and _is_call(s.expr, "prng_step")}
        companions = {s.name for s in stmts if handles & used_names(s)} - needed
        if not companions:
            return keep[::-1]
        needed |= companions


def _is_call(e: ast.Expr, fn: str) -> bool:
    return isinstance(e, ast.Call) and e.fn == fn


def _rename(s: ast.Statement, new: str) -> ast.Statement:
    if isinstance(s, ast.Assignment):
        return dataclasses.replace(s, name=new)
    return dataclasses.replace(s, output=dataclasses.replace(s.output, name=new))


def inline_aliases(stmts: list[ast.Statement], temps: set[str]) -> list[ast.Statement]:
    """``X = T;`` where ``T`` is a generated temporary read nowhere else: name T's definition X."""
    out = list(stmts)
    changed = True
    while changed:
        changed = False
        for k, s in enumerate(out):
            if not (isinstance(s, ast.Assignment) and isinstance(s.expr, ast.Name) and s.expr.name in temps):
                continue
            t = s.expr.name
            readers = [x for x in out if t in used_names(x)]
            defs = [j for j, x in enumerate(out) if x.name == t]
            if len(readers) != 1 or len(defs) != 1:
                continue
            out[defs[0]] = _rename(out[defs[0]], s.name)
            del out[k]
            changed = True
            break
    return out
