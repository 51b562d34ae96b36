"""Reverse-mode automatic differentiation, Tile to Tile.

``grad(program, wrt, outputs)`` returns a new Tile program: its inputs are the forward inputs plus
one cotangent ``D<Out>`` per differentiated output, and its outputs are ``D<X>`` for each ``X`` in
``wrt``, the gradient of ``sum(D<Out> * Out)``. With all-ones cotangents that is the gradient of
the sum of the outputs. The program recomputes the forward statements it needs, then runs the
adjoint statements in reverse order; everything is ordinary Tile, so the result can itself be
differentiated (second order) and runs on the interpreter and on every backend.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence

from tile import ast
from tile.autodiff.build import Namer, call, lit, ref, size_expr, sum_all
from tile.autodiff.contraction import ContractionGrad
from tile.autodiff.elementwise import STRUCTURAL, local_adjoints
from tile.autodiff.nesting import split_deep
from tile.autodiff.simplify import dead_code, inline_aliases
from tile.bind import bind_symbolic
from tile.dtypes import DType
from tile.errors import TileNameError, TileTypeError
from tile.parser import MAX_NESTING, parse
from tile.shapes import is_concrete, same_size
from tile.typed import BoundProgram, Size, TCall, TConst, TContraction, TExpr, TRef


def grad(
    program: str | ast.Program,
    wrt: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    *,
    custom: Mapping[str, str | ast.Program] | None = None,
    dtypes: Mapping[str, DType] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: Sequence[str] | None = None,
) -> ast.Program:
    """The gradient program of ``program``.

    ``wrt``: the inputs to differentiate with respect to (default: every float input).
    ``outputs``: the outputs whose cotangents ``D<Out>`` are inputs (default: all outputs); the
    others contribute nothing (``seed=`` is its old name, deprecated). ``custom``:
    ``{tensor: Tile function}`` gradients used instead of the derived ones (see
    ``tile.autodiff.custom``). ``dtypes``/``shapes``: input types when known (default float32
    inputs with symbolic sizes).
    """
    outputs = _renamed(outputs, seed)
    return gradient(program, wrt, outputs, custom=custom, dtypes=dtypes, shapes=shapes).program


def _renamed(outputs: Sequence[str] | None, seed: Sequence[str] | None) -> Sequence[str] | None:
    """``seed=``, the old name of ``outputs=`` (on the command line ``--seed`` is the random seed)."""
    if seed is None:
        return outputs
    warnings.warn(
        "grad(seed=...) and gradient(seed=...) are now outputs=...", DeprecationWarning, stacklevel=3
    )
    return seed if outputs is None else outputs


@dataclasses.dataclass(frozen=True)
class Gradient:
    """A gradient program with the names it chose: ``{output: cotangent input}`` and
    ``{input: gradient output}``, and the assumptions a derivation without shapes had to make
    (dimensions with different names taken as equal where they broadcast together, unknown ranks
    taken as not broadcasting); with ``shapes`` given there are none."""

    program: ast.Program
    cotangents: dict[str, str]
    gradients: dict[str, str]
    notes: tuple[str, ...] = ()


def gradient(
    program: str | ast.Program,
    wrt: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    *,
    custom: Mapping[str, str | ast.Program] | None = None,
    dtypes: Mapping[str, DType] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: Sequence[str] | None = None,
) -> Gradient:
    """``grad`` with the cotangent and gradient names it chose."""
    outputs = _renamed(outputs, seed)
    if isinstance(program, str):
        program = parse(program)
    bound = bind_symbolic(program, dtypes, shapes)
    return _Reverse(program, bound, wrt, outputs, custom or {}).run()


class _Reverse:
    def __init__(self, program: ast.Program, bound: BoundProgram, wrt, of, custom):
        self.p = program
        self.b = bound
        self.types = bound.types
        inputs = [i.name for i in program.inputs]
        if wrt is None:
            wrt = [n for n in inputs if self.is_float(n)]
        for n in wrt:
            if n not in inputs:
                raise TileNameError(
                    f"cannot differentiate with respect to '{n}': it is not an input",
                    None,
                    hint=f"the inputs are: {', '.join(inputs)}",
                )
            if not self.is_float(n):
                raise TileTypeError(
                    f"cannot differentiate with respect to '{n}' of type "
                    f"{self.types[n].dtype}: only float inputs have gradients",
                    None,
                )
        outputs = list(program.output_names)
        for n in of or ():
            if n not in outputs:
                raise TileNameError(
                    f"cannot differentiate output '{n}': it is not an output",
                    None,
                    hint=f"the outputs are: {', '.join(outputs)}",
                )
        computed = {s.name for s in program.stmts}
        for n in custom:
            if n not in computed:
                raise TileNameError(
                    f"custom gradient for '{n}', which no statement computes",
                    None,
                    hint=f"custom gradients replace a statement's: {', '.join(sorted(computed))}",
                )
        self.wrt = list(wrt)
        self.seed = list(of) if of is not None else outputs
        self.custom = custom
        taken = set(inputs) | set(bound.constants) | {s.name for s in program.stmts}
        self.namer = Namer(taken)
        self.back: list[ast.Statement] = []
        self.contrib: dict[str, list[ast.Expr]] = defaultdict(list)
        self.adj_names: dict[str, str] = {}
        self.temps: set[str] = set()
        self.ones: dict[str, str] = {}
        self.single_leaf = False
        self.notes: list[str] = list(bound.notes)
        self.tstmts = {s.name: s for s in bound.stmts}
        self.cgrad = ContractionGrad(self.namer, self.emit, self.sizes, self.ones_like, self.is_float)

    # ------------------------------------------------------------------ helpers
    def is_float(self, name: str) -> bool:
        return self.types[name].dtype.is_float

    def emit(self, stmt: ast.Statement) -> None:
        self.back.append(stmt)
        self.temps.add(stmt.name)

    def adj_name(self, tensor: str) -> str:
        if tensor not in self.adj_names:
            self.adj_names[tensor] = self.namer.fresh(f"D{tensor}")
        return self.adj_names[tensor]

    def part_name(self, tensor: str) -> str:
        """A fresh name for one contribution to ``tensor``'s adjoint: ``DX_1``, ``DX_2``, ..."""
        base = self.adj_name(tensor)
        k = 1
        while f"{base}_{k}" in self.namer.taken:
            k += 1
        self.namer.taken.add(f"{base}_{k}")
        return f"{base}_{k}"

    def sizes(self, tensor: str) -> tuple[ast.Expr, ...]:
        shape = self.types[tensor].shape
        if shape is None:
            raise TileTypeError(
                f"the rank of '{tensor}' is unknown, so its gradient cannot be written",
                None,
                hint=f"declare its dimensions, e.g. {tensor}[N, M]",
            )
        return tuple(size_expr(d) for d in shape)

    def ones_like(self, tensor: str) -> str:
        if tensor not in self.ones:
            name = self.namer.fresh(f"One_{tensor}")
            if self.types[tensor].rank:
                expr = ast.Binary(
                    "+", ast.Binary("*", call("index", ast.Name(tensor), lit(0)), lit(0)), lit(1)
                )
            else:
                expr = lit(1)
            self.emit(ast.Assignment(name, expr))
            self.ones[tensor] = name
        return self.ones[tensor]

    # --------------------------------------------------------------------- driver
    def run(self) -> Gradient:
        cotangents = []
        cot_names = self.cot_names = {}
        for out in self.seed:
            if not self.is_float(out):
                continue
            name = self.namer.fresh(f"D{out}")
            cot_names[out] = name
            cotangents.append(ast.Input(name, self.cotangent_dims(out, name)))
            self.contrib[out].append(ast.Name(name))
        for stmt in reversed(self.p.stmts):
            if not self.contrib.get(stmt.name) or not self.is_float(stmt.name):
                continue
            g = self.adjoint(stmt.name)
            if isinstance(stmt, ast.Assignment) and isinstance(self.tstmts[stmt.name], TContraction):
                stmt = self.tstmts[stmt.name].source  # simple_reduce, bound as its `+` contraction
            if stmt.name in self.custom:
                from tile.autodiff.custom import inline_custom

                for tensor, expr in inline_custom(self, stmt, self.custom[stmt.name], g):
                    self.contrib[tensor].append(expr)
            elif isinstance(stmt, ast.Assignment):
                # With one tensor read (and constants), nothing can broadcast, even at unknown rank.
                self.single_leaf = len(_leaves(self.tstmts[stmt.name].expr)) <= 1
                self.backprop(
                    stmt.expr,
                    self.tstmts[stmt.name].expr,
                    ast.Name(g),
                    self.types[stmt.name].shape,
                    stmt.name,
                )
            else:
                t = self.tstmts[stmt.name]
                assert isinstance(t, TContraction)
                for tensor, expr in self.cgrad.grads(stmt, t, g, self.part_name):
                    self.contrib[tensor].append(expr)  # already of the tensor's exact shape
        outputs = []
        for x in self.wrt:
            name = self.adj_name(x)
            expr = sum_all(self.contrib[x]) if self.contrib[x] else self.zeros_like(x)
            self.back.append(ast.Assignment(name, expr))
            outputs.append(name)
        # Deep generated expressions get temporaries first, so that nothing after recurses deeply
        # and the printed program parses again (tile.autodiff.nesting; half the limit leaves room).
        tensors = {x.name for x in (*self.p.inputs, *self.p.stmts, *self.back)} | set(self.cot_names.values())
        back = split_deep(self.back, tensors, self.namer.fresh, MAX_NESTING // 2)
        stmts = inline_aliases(dead_code([*self.p.stmts, *back], outputs), self.temps)
        inputs = tuple(self.declare(i) for i in self.p.inputs) + tuple(cotangents)
        result = ast.Program(inputs, tuple(ast.Output(o) for o in outputs), tuple(stmts))
        return Gradient(
            self.fix_dtypes(result, outputs),
            cot_names,
            dict(zip(self.wrt, outputs)),
            tuple(dict.fromkeys(self.notes)),
        )

    def cotangent_dims(self, out: str, name: str) -> tuple[str, ...] | None:
        """``DO`` is declared with ``O``'s dims where they are plain names, fresh ones elsewhere."""
        shape = self.types[out].shape
        if shape is None:
            return None
        dims = []
        for k, d in enumerate(shape):
            e = size_expr(d)
            dims.append(e.name if isinstance(e, ast.Name) else self.namer.fresh(f"{name}_d{k}"))
        return tuple(dims)

    def declare(self, inp: ast.Input) -> ast.Input:
        """Inputs declared without dims get named dims when their sizes appear in the gradient."""
        t = self.types[inp.name]
        if inp.dims is not None or t.shape is None:
            return inp
        dims = tuple(size_expr(d) for d in t.shape)
        if all(isinstance(d, ast.Name) for d in dims):
            return ast.Input(inp.name, tuple(d.name for d in dims))
        return inp

    def zeros_like(self, x: str) -> ast.Expr:
        dt = self.types[x].dtype
        if self.types[x].rank:
            return float_cast(ast.Binary("*", call("index", ast.Name(x), lit(0)), lit(0)), dt)
        return float_cast(lit(0), dt)

    def fix_dtypes(self, program: ast.Program, outputs: list[str]) -> ast.Program:
        """Each gradient gets its input's dtype (a float32 literal may have widened a float16)."""
        dtypes = {n: t.dtype for n, t in self.b.inputs}
        shapes = {
            n: t.shape for n, t in self.b.inputs if t.shape is not None and all(map(is_concrete, t.shape))
        }
        for out, cot in self.cot_names.items():
            t = self.types[out]
            dtypes[cot] = t.dtype
            if t.shape is not None and all(map(is_concrete, t.shape)):
                shapes[cot] = t.shape
        types = bind_symbolic(program, dtypes, shapes).types
        stmts = list(program.stmts)
        for x, out in zip(self.wrt, outputs):
            want = self.types[x].dtype
            if types[out].dtype != want:
                k = next(i for i, s in enumerate(stmts) if s.name == out)
                s = stmts[k]
                if isinstance(s, ast.Assignment):
                    stmts[k] = ast.Assignment(out, float_cast(s.expr, want))
                else:
                    tmp = self.namer.fresh(f"{out}_wide")
                    stmts[k] = dataclasses.replace(s, output=ref(tmp, s.output.indices))
                    stmts.insert(k + 1, ast.Assignment(out, float_cast(ast.Name(tmp), want)))
        return dataclasses.replace(program, stmts=tuple(stmts))

    # ------------------------------------------------------------------- adjoints
    def adjoint(self, tensor: str) -> str:
        """The name holding ``tensor``'s complete adjoint (summing its contributions)."""
        parts = self.contrib[tensor]
        name = self.adj_name(tensor)
        if len(parts) == 1 and isinstance(parts[0], ast.Name):
            return parts[0].name
        self.emit(ast.Assignment(name, sum_all(parts)))
        return name

    def add(self, tensor: str, g: ast.Expr, gshape: tuple[Size, ...] | None) -> None:
        """Add ``g`` (of shape ``gshape``) to ``tensor``'s adjoint, summing out broadcast dims."""
        self.contrib[tensor].append(self.reduce_to(g, gshape, self.types[tensor].shape, tensor))

    def reduce_to(self, g: ast.Expr, gshape, tshape, tensor: str | None = None) -> ast.Expr:
        if gshape is None or tshape is None:
            if not (gshape is None and tshape is None and self.single_leaf):
                self.notes.append(
                    f"assumed the adjoint of '{tensor}' needs no broadcast reduction (its rank "
                    "is unknown); derive with shapes=... to be exact"
                )
            return g
        if len(gshape) == len(tshape) and all(same_size(a, b) for a, b in zip(gshape, tshape)):
            return g
        if not isinstance(g, ast.Name):
            tmp = self.namer.fresh(f"{self.adj_name(tensor)}_b" if tensor else "G")
            self.emit(ast.Assignment(tmp, g))
            g = ast.Name(tmp)
        off = len(gshape) - len(tshape)
        out_idx: list[ast.Expr] = []
        for k, ts in enumerate(tshape):
            gs = gshape[k + off]
            broadcast = is_concrete(ts) and ts == 1 and not (is_concrete(gs) and gs == 1)
            out_idx.append(lit(0) if broadcast else ast.Name(f"i{k + off}"))
        name = self.part_name(tensor) if tensor else self.namer.fresh("G")
        sizes = tuple(size_expr(d) for d in tshape)
        self.emit(
            ast.Contraction(
                ref(name, out_idx),
                sizes,
                ast.AggOp.SUM,
                ast.CombOp.NONE,
                (ref(g.name, [ast.Name(f"i{k}") for k in range(len(gshape))]),),
            )
        )
        return ast.Name(name)

    # ------------------------------------------------------------------ elementwise
    def backprop(self, e: ast.Expr, te: TExpr, g: ast.Expr, gshape, root: str | None) -> None:
        """Push adjoint ``g`` (shape ``gshape``) from expression ``e`` down to the tensors it reads."""
        if isinstance(te, TConst) or not te.type.dtype.is_float:
            return
        if isinstance(te, TRef):
            self.add(te.name, g, gshape)
            return
        assert isinstance(te, TCall)
        args = _tensor_args(e, len(te.args))
        y = ast.Name(root) if root else e
        if te.fn in STRUCTURAL:
            g = self.reduce_to(g, gshape, te.type.shape)
            for a, ta, lg in zip(args, te.args, self.structural(te, e, args, y, g)):
                if lg is not None:
                    self.backprop(a, ta, lg, ta.type.shape, None)
            return
        for a, ta, lg in zip(args, te.args, local_adjoints(te.fn, args, y, g)):
            if lg is not None:
                self.backprop(a, ta, lg, gshape, None)

    def structural(
        self, te: TCall, e: ast.Expr, args: list[ast.Expr], y: ast.Expr, g: ast.Expr
    ) -> list[ast.Expr | None]:
        fn = te.fn
        if fn == "reshape":
            return [call("reshape", g, *(size_expr(d) for d in te.args[0].type.shape))]
        if fn == "gather":
            return [call("scatter", g, args[1], args[0]), None]
        if fn == "scatter":
            return [call("gather", g, args[1]), None, None]
        # row-wise softmaxes: rows sum through a (R, 1) contraction that broadcasts back
        assert isinstance(e, ast.Call)
        rows = e.args[1]
        src = g if fn == "builtin_logsoftmax" else ast.Binary("*", g, y)
        if not isinstance(src, ast.Name):
            tmp = self.namer.fresh("G")
            self.emit(ast.Assignment(tmp, src))
            src = ast.Name(tmp)
        total = self.namer.fresh(f"{src.name}_rowsum")
        self.emit(
            ast.Contraction(
                ref(total, [ast.Name("r"), lit(0)]),
                (rows, lit(1)),
                ast.AggOp.SUM,
                ast.CombOp.NONE,
                (ref(src.name, [ast.Name("r"), ast.Name("c")]),),
            )
        )
        if fn == "builtin_softmax":
            return [ast.Binary("*", y, ast.Binary("-", g, ast.Name(total)))]
        return [ast.Binary("-", g, ast.Binary("*", call("exp", y), ast.Name(total)))]


def float_cast(e: ast.Expr, dt: DType) -> ast.Expr:
    """``e`` converted to float type ``dt``: ``as_float(e, bits)``, or ``as_bfloat(e, 16)``."""
    return call("as_bfloat" if dt is DType.BFLOAT16 else "as_float", e, lit(dt.bits))


def _leaves(e: TExpr) -> set[str]:
    if isinstance(e, TRef):
        return {e.name}
    if isinstance(e, TCall):
        return set().union(*(_leaves(a) for a in e.args)) if e.args else set()
    return set()


def _tensor_args(e: ast.Expr, n: int) -> list[ast.Expr]:
    if isinstance(e, ast.Binary):
        return [e.lhs, e.rhs]
    if isinstance(e, ast.Unary):
        return [e.operand]
    if isinstance(e, ast.Ternary):
        return [e.cond, e.then, e.other]
    assert isinstance(e, ast.Call)
    return list(e.args[:n])
