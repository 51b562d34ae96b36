"""Semantics-preserving rewrites of Tile programs, for the ``metamorphic`` conformance family.

Each rewrite is a pure function ``rewrite(variant, rng) -> Variant | None``: a program (its syntax
tree) and its inputs in, an equivalent program and inputs out, or None where the rewrite finds
nothing to change. Equivalent means the interpreter gives the same outputs, bit for bit (nans
alike): every operation keeps its operand types and its one rounding, only the program's shape
changes. tests/test_metamorphic_rewrites.py checks this on many drawn programs; the family
(``conformance/test_metamorphic.py``) then checks that a target agrees with the interpreter on the
variants too, and that a variant and its original agree on the target.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

import tile
from tile import ast
from tile.builtins import BUILTINS
from tile.dtypes import DType
from tile.inputs import input_types
from tile.typed import TCall, TensorType


@dataclass(frozen=True)
class Variant:
    program: ast.Program
    inputs: dict[str, np.ndarray]

    @property
    def source(self) -> str:
        return ast.format_program(self.program)


Rewrite = Callable[[Variant, random.Random], "Variant | None"]

# builtins whose value is a handle or that must be a statement of their own: never split out,
# inlined into, or wrapped
_STATEMENT_ONLY = {"simple_reduce", "prng_step", "prng_state"}


# ----------------------------------------------------------------------------------- helpers


def _typed(v: Variant):
    """The bound program (types of every statement and subexpression)."""
    return tile.bind(v.program, input_types(v.program, v.inputs), v.inputs)


def _tensor_names(p: ast.Program) -> set[str]:
    return {i.name for i in p.inputs} | {s.name for s in p.stmts}


def _walk_typed(e: ast.Expr, t, out: dict[int, TensorType]) -> None:
    """Each AST node's type (by ``id``) where the typed tree mirrors it call for call."""
    if not hasattr(t, "type"):
        return
    out[id(e)] = t.type
    if isinstance(t, TCall):
        kids = ast.children(e)
        if isinstance(e, ast.Call):
            kids = kids[: len(t.args)]
        if len(kids) == len(t.args):
            for k, a in zip(kids, t.args):
                _walk_typed(k, a, out)


def _expr_types(v: Variant) -> dict[int, TensorType]:
    bound = _typed(v)
    typed = {s.name: s for s in bound.stmts}
    out: dict[int, TensorType] = {}
    for s in v.program.stmts:
        if isinstance(s, ast.Assignment) and s.name in typed and hasattr(typed[s.name], "expr"):
            _walk_typed(s.expr, typed[s.name].expr, out)
    return out


def _map(e: ast.Expr, leaf: Callable[[ast.Expr], ast.Expr | None], stop=lambda x: False) -> ast.Expr:
    """``e`` rebuilt bottom-up with each node for which ``leaf`` gives a replacement replaced (and
    not entered); nodes for which ``stop`` holds are kept whole."""
    new = leaf(e)
    if new is not None:
        return new
    if stop(e):
        return e
    if isinstance(e, ast.Unary):
        return dataclasses.replace(e, operand=_map(e.operand, leaf, stop))
    if isinstance(e, ast.Binary):
        return dataclasses.replace(e, lhs=_map(e.lhs, leaf, stop), rhs=_map(e.rhs, leaf, stop))
    if isinstance(e, ast.Ternary):
        parts = [_map(x, leaf, stop) for x in (e.cond, e.then, e.other)]
        return dataclasses.replace(e, cond=parts[0], then=parts[1], other=parts[2])
    if isinstance(e, ast.Call):
        return dataclasses.replace(e, args=tuple(_map(a, leaf, stop) for a in e.args))
    return e


def _replace_expr(e: ast.Expr, old: ast.Expr, new: ast.Expr) -> ast.Expr:
    """``e`` with the node ``old`` (by identity) replaced by ``new``."""
    return _map(e, lambda x: new if x is old else None)


def _renamed(e: ast.Expr, mapping: dict[str, str]) -> ast.Expr:
    """``e`` with the names in ``mapping`` renamed."""
    return _map(e, lambda x: dataclasses.replace(x, name=mapping[x.name])
                if isinstance(x, ast.Name) and x.name in mapping else None)


def _tensor_subexpressions(e: ast.Expr, tensors: set[str]) -> Iterator[ast.Expr]:
    """Subexpressions of ``e`` in value positions (not a builtin's compile-time arguments), outer first."""
    yield e
    kids = ast.children(e)
    if isinstance(e, ast.Call):
        if e.fn in _STATEMENT_ONLY:
            return
        b = BUILTINS.get(e.fn)
        if b is not None and b.params != 0:
            kids = kids[: b.tensors]
    for k in kids:
        yield from _tensor_subexpressions(k, tensors)


def _mentions(e: ast.Expr, tensors: set[str]) -> bool:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.Name) and x.name in tensors:
            return True
        stack.extend(ast.children(x))
    return False


def _calls(e: ast.Expr, fns: set[str]) -> bool:
    """Whether ``e`` calls any of ``fns``."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.Call) and x.fn in fns:
            return True
        stack.extend(ast.children(x))
    return False


def _fresh(taken: set[str], stem: str) -> str:
    k = 0
    while f"{stem}{k}" in taken:
        k += 1
    return f"{stem}{k}"


def _rename_tensor(p: ast.Program, old: str, new: str) -> ast.Program:
    """Every read of tensor ``old`` (elementwise names, contraction operands, ``default``) renamed."""

    stmts = []
    for s in p.stmts:
        if isinstance(s, ast.Assignment):
            stmts.append(dataclasses.replace(s, expr=_renamed(s.expr, {old: new})))
        else:
            ops = tuple(dataclasses.replace(o, name=new) if o.name == old else o for o in s.operands)
            default = new if s.default == old else s.default
            stmts.append(dataclasses.replace(s, operands=ops, default=default))
    return dataclasses.replace(p, stmts=tuple(stmts))


def _with_stmts(v: Variant, stmts) -> Variant:
    return Variant(dataclasses.replace(v.program, stmts=tuple(stmts)), v.inputs)


# ---------------------------------------------------------------------------------- rewrites


def opaque_dead_branch(v: Variant, rng: random.Random) -> Variant | None:
    """One elementwise statement ``T = E;`` becomes ``T = E < E ? J : E;``: ``E < E`` is false for
    every value (nan included), so the junk ``J`` (``E + E``, or ``~E`` for bool, of E's own type) is
    never chosen and the result type, promote(J, E), is E's. A program without an elementwise
    statement gets one: its output's contraction writes a temporary that the new statement reads."""
    p = v.program
    outs = set(p.output_names)
    assigns = [i for i, s in enumerate(p.stmts) if isinstance(s, ast.Assignment)
               and not (isinstance(s.expr, ast.Call) and s.expr.fn in _STATEMENT_ONLY | {"prng_value"})]
    tensors = _tensor_names(p)
    if assigns:
        i = rng.choice(assigns)
        stmt = p.stmts[i]
        if not _mentions(stmt.expr, tensors):
            return None
        stmts = list(p.stmts)
        target, e = stmt, stmt.expr
    else:
        outputs = [i for i, s in enumerate(p.stmts) if s.name in outs]
        if not outputs:
            return None
        i = rng.choice(outputs)
        stmt = p.stmts[i]
        tmp = _fresh(tensors, "D")
        stmts = list(_rename_tensor(p, stmt.name, tmp).stmts)
        if isinstance(stmt, ast.Contraction):
            stmts[i] = dataclasses.replace(stmts[i], output=dataclasses.replace(stmt.output, name=tmp))
        else:  # a statement-only builtin's result
            stmts[i] = dataclasses.replace(stmts[i], name=tmp)
        target, e = ast.Assignment(stmt.name, ast.Name(tmp)), ast.Name(tmp)
        stmts.insert(i + 1, target)
        i += 1
    dtype = _typed(Variant(dataclasses.replace(p, stmts=tuple(stmts)), v.inputs)).types[target.name].dtype
    junk = ast.Unary("~", e) if dtype is DType.BOOL else ast.Binary("+", e, e)
    guarded = ast.Ternary(ast.Binary("<", e, e), junk, e)
    stmts[i] = dataclasses.replace(target, expr=guarded)
    return _with_stmts(v, stmts)


def reassociate_integers(v: Variant, rng: random.Random) -> Variant | None:
    """``(a + b) + c`` becomes ``a + (b + c)`` (and back; ``*`` alike), or else ``a + b`` becomes
    ``b + a``, where a, b, c, the inner and the outer operation all have one integer type: wrapping
    addition and multiplication modulo 2^bits are associative and commutative. Floats and mixed
    types (``int8 + int8`` wraps in int8 before an int32 operand widens it) are left alone."""
    types = _expr_types(v)

    def one_int(*es) -> bool:
        ts = [types.get(id(e)) for e in es]
        return all(t is not None for t in ts) and len({t.dtype for t in ts}) == 1 and ts[0].dtype.is_int

    candidates = []
    for k, s in enumerate(v.program.stmts):
        if not isinstance(s, ast.Assignment):
            continue
        stack = [s.expr]
        while stack:
            e = stack.pop()
            stack.extend(ast.children(e))
            if not isinstance(e, ast.Binary) or e.op not in "+*":
                continue
            a, b = e.lhs, e.rhs
            if isinstance(a, ast.Binary) and a.op == e.op and one_int(e, a, a.lhs, a.rhs, b):
                candidates.append((0, k, e, ast.Binary(e.op, a.lhs, ast.Binary(e.op, a.rhs, b))))
            elif isinstance(b, ast.Binary) and b.op == e.op and one_int(e, b, a, b.lhs, b.rhs):
                candidates.append((0, k, e, ast.Binary(e.op, ast.Binary(e.op, a, b.lhs), b.rhs)))
            elif one_int(e, a, b):
                candidates.append((1, k, e, ast.Binary(e.op, b, a)))
    if not candidates:
        return None
    best = min(c[0] for c in candidates)
    _, k, old, new = rng.choice([c for c in candidates if c[0] == best])
    stmts = list(v.program.stmts)
    stmts[k] = dataclasses.replace(stmts[k], expr=_replace_expr(stmts[k].expr, old, new))
    return _with_stmts(v, stmts)


def transpose_input(v: Variant, rng: random.Random) -> Variant | None:
    """An input X of rank >= 2 is passed permuted (``XT = X.transpose(perm)``) and the program first
    restores it, ``X[i0, i1..: sizes] = =(XT[i_perm..]);``: a copy, every element written once."""
    p = v.program
    ranked = [i for i in p.inputs if v.inputs[i.name].ndim >= 2 and v.inputs[i.name].size > 0]
    if not ranked:
        return None
    inp = rng.choice(ranked)
    x = v.inputs[inp.name]
    perm = list(range(x.ndim))
    while perm == sorted(perm):
        rng.shuffle(perm)
    new = _fresh(_tensor_names(p), f"{inp.name}T")
    idx = [f"t{d}" for d in range(x.ndim)]
    sizes = [ast.Name(inp.dims[d]) if inp.dims else ast.IntLit(x.shape[d]) for d in range(x.ndim)]
    copy = ast.Contraction(
        ast.TensorRef(inp.name, tuple(ast.Name(i) for i in idx)),
        tuple(sizes),
        ast.AggOp.ASSIGN,
        ast.CombOp.NONE,
        (ast.TensorRef(new, tuple(ast.Name(idx[d]) for d in perm)),),
    )
    dims = None if inp.dims is None else tuple(inp.dims[d] for d in perm)
    inputs = tuple(ast.Input(new, dims) if i is inp else i for i in p.inputs)
    prog = dataclasses.replace(p, inputs=inputs, stmts=(copy, *p.stmts))
    arrays = {(new if k == inp.name else k): (np.ascontiguousarray(a.transpose(perm)) if k == inp.name else a)
              for k, a in v.inputs.items()}
    return Variant(prog, arrays)


def split_statement(v: Variant, rng: random.Random) -> Variant | None:
    """A compound subexpression S of an elementwise statement, reading a tensor, moves into a
    temporary ``Sk = S;`` just before it: stored in its own type, it is read back unchanged."""
    p = v.program
    tensors = _tensor_names(p)
    spots = []
    for k, s in enumerate(p.stmts):
        if isinstance(s, ast.Assignment):
            for e in list(_tensor_subexpressions(s.expr, tensors))[1:]:
                if isinstance(e, (ast.Binary, ast.Unary, ast.Ternary, ast.Call)) and _mentions(e, tensors):
                    if not (isinstance(e, ast.Call) and e.fn in _STATEMENT_ONLY):
                        spots.append((k, e))
    if not spots:
        return None
    k, e = rng.choice(spots)
    name = _fresh(tensors, "S")
    stmts = list(p.stmts)
    stmts[k] = dataclasses.replace(stmts[k], expr=_replace_expr(stmts[k].expr, e, ast.Name(name)))
    stmts.insert(k, ast.Assignment(name, e))
    return _with_stmts(v, stmts)


def inline_temporary(v: Variant, rng: random.Random) -> Variant | None:
    """An elementwise temporary ``T = E;`` (not an output, read only by later elementwise
    statements, E reading a tensor) is replaced by ``(E)`` where it is read, and dropped."""
    p = v.program
    tensors = _tensor_names(p)
    outs = set(p.output_names)
    read_by_contraction = {o.name for s in p.stmts if isinstance(s, ast.Contraction) for o in s.operands}
    read_by_contraction |= {s.default for s in p.stmts if isinstance(s, ast.Contraction) and s.default}
    ok = [k for k, s in enumerate(p.stmts) if isinstance(s, ast.Assignment) and s.name not in outs
          and s.name not in read_by_contraction and _mentions(s.expr, tensors)
          and not _calls(s.expr, _STATEMENT_ONLY | {"prng_value"})
          and any(_mentions(t.expr, {s.name}) for t in p.stmts[k + 1 :] if isinstance(t, ast.Assignment))]
    if not ok:
        return None
    k = rng.choice(ok)
    name, e = p.stmts[k].name, p.stmts[k].expr

    def sub(x: ast.Expr) -> ast.Expr:
        return _map(x, lambda y: e if isinstance(y, ast.Name) and y.name == name else None,
                    lambda y: isinstance(y, ast.Call) and y.fn in _STATEMENT_ONLY)

    later = p.stmts[k + 1 :]
    for s in later:  # a statement-only builtin must keep a plain name for its argument
        if isinstance(s, ast.Assignment) and isinstance(s.expr, ast.Call) and s.expr.fn in _STATEMENT_ONLY:
            if any(isinstance(a, ast.Name) and a.name == name for a in s.expr.args):
                return None
    stmts = list(p.stmts[:k])
    stmts += [dataclasses.replace(s, expr=sub(s.expr)) if isinstance(s, ast.Assignment) else s for s in later]
    return _with_stmts(v, stmts)


def rename_indices(v: Variant, rng: random.Random) -> Variant | None:
    """Alpha-renaming: every index variable of one contraction gets a fresh name."""
    p = v.program
    spots = [k for k, s in enumerate(p.stmts) if isinstance(s, ast.Contraction)]
    if not spots:
        return None
    k = rng.choice(spots)
    s = p.stmts[k]
    used = {e.name for e in ast.expressions(s) if isinstance(e, ast.Name) and e.is_index}
    if not used:
        return None
    taken = set(used)
    mapping = {}
    for n in sorted(used):
        mapping[n] = _fresh(taken | set(mapping.values()), "a")

    def poly(e: ast.Expr) -> ast.Expr:
        return _renamed(e, mapping)

    def ref(r: ast.TensorRef) -> ast.TensorRef:
        return dataclasses.replace(r, indices=tuple(poly(i) for i in r.indices))

    new = dataclasses.replace(
        s,
        output=ref(s.output),
        operands=tuple(ref(o) for o in s.operands),
        constraints=tuple(dataclasses.replace(c, poly=poly(c.poly)) for c in s.constraints),
    )
    stmts = list(p.stmts)
    stmts[k] = new
    return _with_stmts(v, stmts)


def identity_constraint(v: Variant, rng: random.Random) -> Variant | None:
    """A contraction whose output index d is a plain index variable i, with size N, gets the
    constraint ``i < N``: every tuple it writes already has 0 <= i < N, so nothing is dropped."""
    p = v.program
    spots = []
    for k, s in enumerate(p.stmts):
        if isinstance(s, ast.Contraction) and s.sizes:
            for d, i in enumerate(s.output.indices):
                if isinstance(i, ast.Name) and i.is_index and d < len(s.sizes):
                    spots.append((k, i, s.sizes[d]))
    if not spots:
        return None
    k, i, size = rng.choice(spots)
    s = p.stmts[k]
    stmts = list(p.stmts)
    stmts[k] = dataclasses.replace(s, constraints=(*s.constraints, ast.Constraint(ast.Name(i.name), size)))
    return _with_stmts(v, stmts)


REWRITES: dict[str, Rewrite] = {
    "opaque_dead_branch": opaque_dead_branch,
    "reassociate_integers": reassociate_integers,
    "transpose_input": transpose_input,
    "split_statement": split_statement,
    "inline_temporary": inline_temporary,
    "rename_indices": rename_indices,
    "identity_constraint": identity_constraint,
}


def apply(v: Variant, names: list[str], seed: int) -> tuple[Variant, list[str]]:
    """The rewrites ``names`` in turn (one random generator seeded with ``seed``): the variant and
    the names of those that changed something. The variant's text is parsed back, so it is what a
    target compiles."""
    rng = random.Random(seed)
    done = []
    for n in names:
        out = REWRITES[n](v, rng)
        if out is not None:
            v = Variant(tile.parse(out.source), out.inputs)
            done.append(n)
    return v, done
