"""What a conformance run exercised, and which of it an example would have caught had it been wrong.

Every compared example is read for its operations (``tile.capabilities``' names: builtins, with
casts and specials as categories of their own, aggregations, combinations), its dtypes and its
index forms (contractions with constraints, offsets, strides other than 1, divisions). An example
*distinguishes* an operation when, at one place the program uses it, replacing it by each of its
neighbours (``NEIGHBOURS``: ``max`` by ``min`` and ``add``, ``cmp_lt`` by ``cmp_le`` and
``cmp_gt``, ``as_int(X, 32)`` by the other widths, ``agg_max`` by ``agg_min`` and ``agg_sum``,
...) changes the interpreter's output values: a target that computed a neighbour instead would
have failed on it. Mutants the interpreter refuses are left out; an operation with no neighbour
(``gather``, ``agg_assign``) can only be reached. Finding that costs an interpreter run per
mutant, so each operation is mutated only until it has ``K`` distinguishing examples per target
(``--conformance-distinguish=K``, 0: none; the seconds spent are in the summary).

``focus`` serves ``--conformance-ops``: an example that uses none of the chosen operations is
steered to one (an operation of the same exact group is replaced by a chosen one: ``cmp_gt`` by
``cmp_lt``, ``agg_sum`` by ``agg_max``) or else left out, unchecked.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

import ref_interp
import tile
from stripe.specials import STRUCTURAL
from tile import ast
from tile.builtins import BUILTINS
from tile.capabilities import AGGREGATIONS, COMBINATIONS
from tile.dtypes import DType
from tile.inputs import input_types
from tile.typed import TAssign, TCall, TContraction

CASTS = frozenset({"as_float", "as_bfloat", "as_int", "as_uint", "as_bool", "round_tf32"})
INDEX_FORMS = ("constraints", "offsets", "strides", "divisions")
_AGG_BY_NAME = {v: k for k, v in AGGREGATIONS.items()}
_COMB_BY_NAME = {v: k for k, v in COMBINATIONS.items()}


def category(op: str) -> str:
    if op in _AGG_BY_NAME:
        return "aggregation"
    if op in _COMB_BY_NAME:
        return "combination"
    if op in CASTS:
        return "cast"
    return "special" if op in STRUCTURAL else "builtin"


UNIVERSE = sorted((category(op), op) for op in {*BUILTINS, *_AGG_BY_NAME, *_COMB_BY_NAME})

# An operation's neighbours: what a code generator plausibly computes instead by mistake.
NEIGHBOURS = {
    "add": ("sub", "mul"), "sub": ("add",), "mul": ("add", "div"), "div": ("mul", "mod"),
    "mod": ("div",), "pow": ("mul",), "max": ("min", "add"), "min": ("max", "add"),
    "cmp_eq": ("cmp_ne", "cmp_le", "cmp_ge"), "cmp_ne": ("cmp_eq",), "cmp_lt": ("cmp_le", "cmp_gt"),
    "cmp_gt": ("cmp_ge", "cmp_lt"), "cmp_le": ("cmp_lt", "cmp_ge"), "cmp_ge": ("cmp_gt", "cmp_le"),
    "bit_and": ("bit_or", "bit_xor"), "bit_or": ("bit_and", "bit_xor"), "bit_xor": ("bit_or", "bit_and"),
    "bit_left": ("bit_right",), "bit_right": ("bit_left",), "bit_not": ("neg",),
    "neg": ("ident", "abs"), "abs": ("ident", "neg"), "relu": ("ident", "abs"), "ident": ("neg",),
    "exp": ("cosh",), "log": ("sqrt",), "sqrt": ("log",), "sin": ("cos", "tan"), "cos": ("sin",),
    "tan": ("sin",), "sinh": ("tanh", "exp"), "cosh": ("exp",), "tanh": ("sigmoid", "sinh"),
    "asin": ("acos", "atan"), "acos": ("asin",), "atan": ("asin", "tanh"), "asinh": ("atanh",),
    "acosh": ("asinh",), "atanh": ("asinh",), "floor": ("ceil", "round"), "ceil": ("floor", "round"),
    "round": ("floor", "ceil"), "sigmoid": ("tanh",), "recip": ("neg",), "round_tf32": ("ident",),
    "as_bfloat": ("as_float",), "builtin_softmax": ("builtin_logsoftmax",),
    "builtin_logsoftmax": ("builtin_softmax",),
    "agg_sum": ("agg_prod", "agg_max"), "agg_prod": ("agg_sum",), "agg_max": ("agg_min", "agg_sum"),
    "agg_min": ("agg_max", "agg_sum"), "comb_mul": ("comb_add",), "comb_add": ("comb_mul",),
    "comb_eq": ("comb_mul",), "as_bool": ("ident",),  # (a comparison computed as a product; a cast dropped)
}  # fmt: skip
WIDTHS = {"as_float": (16, 32, 64), "as_int": (8, 16, 32, 64), "as_uint": (8, 16, 32, 64)}
# What --conformance-ops may steer an example between: replacing one by another keeps the
# example's tolerance right (exact stays exact on its small integer data).
STEER = (
    ("add", "sub", "mul", "max", "min"),
    ("cmp_eq", "cmp_ne", "cmp_lt", "cmp_gt", "cmp_le", "cmp_ge"),
    ("bit_and", "bit_or", "bit_xor"),
    ("neg", "abs", "relu", "ident"),
    ("floor", "ceil", "round"),
    ("agg_sum", "agg_prod", "agg_max", "agg_min"),
    ("comb_mul", "comb_add"),
)


# ------------------------------------------------------------------------------ reading examples
@dataclass(frozen=True)
class Site:
    """One use of an operation: statement ``stmt`` and, in an assignment, the path of child
    indexes to the expression (a contraction's aggregation or combination: ``path`` None)."""

    op: str
    stmt: int
    path: tuple[int, ...] | None


def op_of(e: ast.Expr) -> str | None:
    if isinstance(e, ast.Binary):
        return ast.BINARY_FUNCTIONS.get(e.op)
    if isinstance(e, ast.Unary):
        return ast.UNARY_FUNCTIONS.get(e.op)
    if isinstance(e, ast.Ternary):
        return "cond"
    return e.fn if isinstance(e, ast.Call) else None


def sites(program: ast.Program, constants=()) -> Iterator[Site]:
    """Every use of an operation in ``program`` (named constants, folded at binding, are not)."""
    for i, s in enumerate(program.stmts):
        if isinstance(s, ast.Contraction):
            yield Site(AGGREGATIONS[s.agg], i, None)
            if s.comb in COMBINATIONS:
                yield Site(COMBINATIONS[s.comb], i, None)
        elif s.name not in constants:
            stack = [(s.expr, ())]
            while stack:
                e, path = stack.pop()
                op = op_of(e)
                if op is not None:
                    yield Site(op, i, path)
                stack += [(c, path + (k,)) for k, c in enumerate(ast.children(e))]


def features(bound) -> set[tuple[str, str]]:
    """The dtypes and index forms an example uses, as (category, name)."""
    out = {("dtype", d.value) for d in dtypes_used(bound)}
    for s in bound.stmts:
        if not isinstance(s, TContraction):
            continue
        if s.constraints:
            out.add(("index", "constraints"))
        polys = [p for a in (s.output, *s.operands) for p in a.polys] + [c.poly for c in s.constraints]
        for p in polys:
            coeffs = [c for _, c in p.terms]
            if p.const:
                out.add(("index", "offsets"))
            if any(c.denominator != 1 or p.const.denominator != 1 for c in coeffs):
                out.add(("index", "divisions"))
            if any(c.denominator == 1 and c != 1 for c in coeffs):
                out.add(("index", "strides"))
    return out


def dtypes_used(bound) -> set[DType]:
    """Every dtype the program computes in: its tensors' and each call's inside an expression
    (``as_bfloat(X, 16) + 1`` computes in bfloat16 whatever its result is)."""
    out = {t.dtype for t in bound.types.values()}
    stack = [s.expr for s in bound.stmts if isinstance(s, TAssign)]
    while stack:
        e = stack.pop()
        out.add(e.type.dtype)
        if isinstance(e, TCall):
            stack.extend(e.args)
    return out


def used(program: ast.Program, bound) -> set[tuple[str, str]]:
    """Everything an example exercises, as (category, name)."""
    ops = {(category(s.op), s.op) for s in sites(program, bound.constants)}
    return ops | features(bound)


# ------------------------------------------------------------------------------ mutants
def _at(e: ast.Expr, path: tuple[int, ...], change: Callable[[ast.Expr], ast.Expr]) -> ast.Expr:
    if not path:
        return change(e)
    kids = list(ast.children(e))
    kids[path[0]] = _at(kids[path[0]], path[1:], change)
    if isinstance(e, ast.Unary):
        return dataclasses.replace(e, operand=kids[0])
    if isinstance(e, ast.Binary):
        return dataclasses.replace(e, lhs=kids[0], rhs=kids[1])
    if isinstance(e, ast.Ternary):
        return dataclasses.replace(e, cond=kids[0], then=kids[1], other=kids[2])
    return dataclasses.replace(e, args=tuple(kids))


def _node(program: ast.Program, site: Site) -> ast.Expr:
    e = program.stmts[site.stmt].expr
    for k in site.path:
        e = ast.children(e)[k]
    return e


def _replaced(program: ast.Program, site: Site, new: str | Callable) -> ast.Program:
    """``program`` with the operation at ``site`` replaced by ``new`` (a name, or a function
    of the expression node giving its replacement)."""
    s = program.stmts[site.stmt]
    if site.path is None:
        if new in _AGG_BY_NAME:
            s = dataclasses.replace(s, agg=_AGG_BY_NAME[new])
        else:
            s = dataclasses.replace(s, comb=_COMB_BY_NAME[new])
    else:
        change = new if callable(new) else (lambda e: ast.Call(new, ast.children(e), e.span))
        s = dataclasses.replace(s, expr=_at(s.expr, site.path, change))
    stmts = program.stmts[: site.stmt] + (s,) + program.stmts[site.stmt + 1 :]
    return dataclasses.replace(program, stmts=stmts)


def mutants(program: ast.Program, site: Site) -> list[ast.Program]:
    """The programs with the operation at ``site`` replaced by each of its neighbours."""
    out = [_replaced(program, site, n) for n in NEIGHBOURS.get(site.op, ())]
    if site.op == "cond":  # the branches swapped
        out.append(_replaced(program, site, lambda e: ast.Call("cond", _swap(ast.children(e)), e.span)))
    node = _node(program, site) if site.path is not None else None
    args = ast.children(node) if node is not None else ()
    if site.op in WIDTHS and len(args) == 2 and isinstance(args[1], ast.IntLit):
        for w in WIDTHS[site.op]:
            if w != args[1].value:
                width = ast.IntLit(w, args[1].span)

                def change(e, w=width):
                    return ast.Call(e.fn, (ast.children(e)[0], w), e.span)

                out.append(_replaced(program, site, change))
    return out


def _swap(args: tuple) -> tuple:
    return (args[0], args[2], args[1])


def same_values(want: dict, got: dict) -> bool:
    """Whether two interpreter results hold the same values (dtypes aside: a cast's width shows in
    the values it wraps or rounds, not in its static type)."""
    if set(want) != set(got):
        return False
    for k in want:
        w, g = np.asarray(want[k]), np.asarray(got[k])
        if w.shape != g.shape:
            return False
        if w.dtype != g.dtype:
            w, g = w.astype(np.float64), g.astype(np.float64)
        if w.dtype.kind in "fcV" or w.dtype != g.dtype:
            w, g = w.astype(np.float64), g.astype(np.float64)
            if not np.array_equal(w, g, equal_nan=True):
                return False
        elif not np.array_equal(w, g):
            return False
    return True


def distinguishes(program: ast.Program, site: Site, inputs: dict, want: dict, mode: str) -> bool | None:
    """Whether every neighbour of the operation at ``site`` that the interpreter accepts changes
    its output (None: no neighbour it accepts, so nothing to tell)."""
    verdict = None
    for mutant in mutants(program, site):
        try:
            bound = tile.bind(mutant, input_types(mutant, inputs), inputs)
            got = ref_interp.run(bound, inputs, mode)
        except Exception:  # noqa: BLE001 - a mutant that is not a valid program tells nothing
            continue
        if same_values(want, got):
            return False
        verdict = True
    return verdict


# ------------------------------------------------------------------------------ the counts
@dataclass
class Coverage:
    """Per target: examples compared per (category, name), and distinguishing ones per operation."""

    k: int = 3  # distinguishing examples wanted per operation and target (0: none computed)
    examples: Counter = field(default_factory=Counter)  # (target, category, name) -> examples
    distinguishing: Counter = field(default_factory=Counter)  # (target, category, name) -> examples
    seconds: float = 0.0  # spent mutating
    mutants: int = 0  # interpreter runs of mutants
    _verdicts: dict = field(default_factory=dict)  # (digest, op) -> bool (shared by targets)

    def record(self, target: str, program: ast.Program, bound, inputs: dict, want: dict, mode: str,
               digest: str | None = None) -> None:
        """One compared example of ``target``."""
        for cat, name in used(program, bound):
            self.examples[(target, cat, name)] += 1
        if not self.k:
            return
        start = time.perf_counter()
        by_op: dict[str, list[Site]] = {}
        for s in sites(program, bound.constants):
            by_op.setdefault(s.op, []).append(s)
        for op, where in sorted(by_op.items()):
            key = (target, category(op), op)
            if self.distinguishing[key] >= self.k:
                continue
            cached = self._verdicts.get((digest, op)) if digest else None
            if cached is None:
                cached = False
                for s in where:
                    self.mutants += len(mutants(program, s))
                    if distinguishes(program, s, inputs, want, mode):
                        cached = True
                        break
                if digest:
                    self._verdicts[(digest, op)] = cached
            self.distinguishing[key] += cached
        self.seconds += time.perf_counter() - start

    def targets(self) -> list[str]:
        return sorted({t for t, _, _ in self.examples})

    def table(self, target: str) -> list[dict]:
        """Every operation (reached or not), then the dtypes and index forms met, as rows."""
        keys = [(c, n) for c, n in UNIVERSE]
        keys += sorted((c, n) for t, c, n in self.examples if t == target and c in ("dtype", "index"))
        return [
            {"category": c, "name": n, "examples": self.examples[(target, c, n)],
             "distinguishing": self.distinguishing[(target, c, n)]}
            for c, n in keys
        ]  # fmt: skip

    def verdict(self, target: str) -> dict[str, list[str]]:
        """The operations distinguished, only reached and unexercised on ``target``."""
        out: dict[str, list[str]] = {"distinguished": [], "reached": [], "unexercised": []}
        for c, n in UNIVERSE:
            if self.distinguishing[(target, c, n)]:
                out["distinguished"].append(n)
            elif self.examples[(target, c, n)]:
                out["reached"].append(n)
            else:
                out["unexercised"].append(n)
        return out

    def lines(self) -> list[str]:
        out = []
        for t in self.targets():
            v = self.verdict(t)
            out.append(
                f"coverage on {t}: {len(v['distinguished'])}/{len(UNIVERSE)} operations distinguished, "
                f"{len(v['reached'])} only reached: {_names(v['reached'])}, "
                f"{len(v['unexercised'])} unexercised: {_names(v['unexercised'])}"
            )
            met = [f"{n} {m}" for (tt, c, n), m in sorted(self.examples.items())
                   if tt == t and c in ("dtype", "index")]
            out.append("  examples per dtype and index form: " + (", ".join(met) or "none"))
        if out:
            out.append(
                f"  (distinguishing: the interpreter's output changes when the operation is replaced by "
                f"its neighbours; computed up to {self.k} per operation: {self.mutants} mutants, "
                f"{self.seconds:.1f} s)"
            )
        return out

    def to_json(self) -> dict:
        return {
            "k": self.k, "seconds": self.seconds, "mutants": self.mutants,
            "examples": [[*key, n] for key, n in self.examples.items()],
            "distinguishing": [[*key, n] for key, n in self.distinguishing.items()],
        }  # fmt: skip

    def merge(self, data: dict) -> None:
        for *key, n in data.get("examples", []):
            self.examples[tuple(key)] += n
        for *key, n in data.get("distinguishing", []):
            self.distinguishing[tuple(key)] += n
        self.seconds += data.get("seconds", 0.0)
        self.mutants += data.get("mutants", 0)

    def summary(self) -> dict:
        """``--conformance-json``'s ``coverage``: per target, the full table and the verdict."""
        return {
            t: {"table": self.table(t), **self.verdict(t)} for t in self.targets()
        } | ({"_cost": {"k": self.k, "mutants": self.mutants, "seconds": round(self.seconds, 3)}}
             if self.examples else {})


def _names(names: list[str], most: int = 12) -> str:
    if not names:
        return "none"
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


# ------------------------------------------------------------------------------ --conformance-ops
def focus(program: ast.Program, bound, chosen: frozenset[str]) -> ast.Program | None:
    """``program`` if it uses a chosen operation; else the program with its first operation of a
    ``STEER`` group holding a chosen one replaced by it (the first such chosen one); else None."""
    found = list(sites(program, bound.constants))
    if any(s.op in chosen for s in found):
        return program
    for s in found:
        for group in STEER:
            if s.op in group:
                for op in group:
                    if op in chosen:
                        return _replaced(program, s, op)
    return None


COVERAGE = Coverage()
