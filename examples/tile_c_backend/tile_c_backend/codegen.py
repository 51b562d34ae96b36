"""Stripe kernels -> one C source: a function per kernel, ``void SYMBOL(char **buffers)``.

Every kernel is a ``stripe.ir.Block``; its refinements of the program's buffers take their
addresses from ``buffers`` (in ``KernelInfo.buffers`` order, each of its ``buffer_dtypes``). A
block becomes one loop per index (row-major: the first index outermost, as the interpreter
enumerates points), an ``if`` over its constraints, and its statements in order inside:

* a refinement is an element offset into its buffer: the parent's offset plus
  ``sum(access[d] * parent stride[d])`` (at kernel level the parent is the buffer, whose strides
  are the refinement's own); one that refines nothing (``none``, no ``from``) is a zeroed local
  allocation for each point;
* ``load`` converts from the buffer's dtype to the refinement's, ``store`` back, aggregating
  with the refinement's ``agg_op`` in the buffer's type (``assign``: the last writer wins);
* ``load_index`` is an int64 affine of the indexes, a ``Constant`` a typed literal (float ones
  are doubles, converted where used), an ``Intrinsic`` a C expression (``cexpr``);
* ``Special``s are whole-view loops (``specials``); nested blocks nest.

Points run one after another in row-major order, so every aggregation receives its values in the
interpreter's order, rounded as there: float results equal the interpreter's (``strict`` holds by
construction), but for the C library's transcendental functions and a softmax's row sum, which
numpy adds pairwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources

from backends.hal import KernelInfo, kernel_symbol
from stripe.ir import (
    Affine,
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
    where,
)
from tile.dtypes import DType

from tile_c_backend import cexpr
from tile_c_backend.errors import UnsupportedConstruct
from tile_c_backend.specials import special
from tile_c_backend.views import View

AGG_OPS = ("", "assign", "add", "mul", "max", "min")
LOCAL_STACK_BYTES = 1 << 16  # local allocations up to this size live on the stack, larger ones in calloc


def runtime() -> str:
    """The C helpers every source starts with (``runtime.h``)."""
    return resources.files("tile_c_backend").joinpath("runtime.h").read_text(encoding="utf-8")


def generate(kernels: Sequence[KernelInfo]) -> tuple[str, list[str]]:
    """The C source of every kernel, and each kernel's function name (``kernel_symbol``)."""
    parts = [runtime()]
    symbols = []
    for k, info in enumerate(kernels):
        symbol = kernel_symbol(k, info)
        symbols.append(symbol)
        parts.append(_Kernel(info).function(symbol))
    return "\n".join(parts), symbols


def comment(text: str) -> str:
    """``text`` as a C comment."""
    return "/* " + text.replace("*/", "* /") + " */"


class Names:
    """Unique, valid C identifiers for Stripe names (which may hold any character)."""

    def __init__(self):
        self.count = 0

    def __call__(self, prefix: str, name: str) -> str:
        self.count += 1
        clean = re.sub(r"[^A-Za-z0-9_]", "_", name)[:24]
        return f"{prefix}{self.count}_{clean}"


class _Kernel:
    def __init__(self, info: KernelInfo):
        self.info = info
        self.lines: list[str] = []
        self.depth = 1
        self.names = Names()

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def open(self, line: str) -> None:
        self.emit(line + " {")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.emit("}")

    def function(self, symbol: str) -> str:
        info = self.info
        block = info.block
        if not isinstance(block, Block):
            raise UnsupportedConstruct(
                f"a kernel that is a {type(block).__name__}, not a Stripe block", info.name
            )
        dtypes = info.buffer_dtypes or ()
        buffers = {}
        for k, name in enumerate(info.buffers):
            dt = dtypes[k] if k < len(dtypes) else _first_dtype(block, name)
            cname = self.names("b", name)
            self.emit(f"{cexpr.storage(dt)} *{cname} = ({cexpr.storage(dt)} *)buffers[{k}];")
            buffers[name] = (cname, dt)
        # at kernel level a refinement's parent is its buffer, with the refinement's own strides
        parents = {}
        for r in block.refs:
            if r.source in buffers:
                cname, dt = buffers[r.source]
                parents[r.source] = View(r.source, cname, dt, "0", r.shape.dims, dt, "")
        self.block(block, parents, {})
        body = "\n".join(self.lines)
        return f"{comment(info.name)}\nvoid {symbol}(char **buffers) {{\n{body}\n}}\n"

    # ------------------------------------------------------------------------------ blocks
    def block(self, block: Block, outer: dict[str, View], env: dict[str, str]) -> None:
        """``block`` run for every point of its index space, given the enclosing block's views
        and index variables (C names by Stripe name)."""
        here = where(block)
        self.open(comment(here))
        own: dict[str, str] = {}
        for ix in block.idxs:
            if ix.range < 0:
                raise UnsupportedConstruct(f"index '{ix.name}' with the negative range {ix.range}", here)
            start = "0" if ix.affine is None else self.affine(ix.affine, env, here, f"index '{ix.name}'")
            var = own[ix.name] = self.names("i", ix.name)
            if start == "0":
                self.open(f"for (int64_t {var} = 0; {var} < {ix.range}; ++{var})")
            else:
                first = self.names("s", ix.name)
                self.emit(f"const int64_t {first} = {start};")
                self.open(f"for (int64_t {var} = {first}; {var} < {first} + {ix.range}; ++{var})")
        if block.constraints:
            tests = [f"{self.affine(c, own, here, 'a constraint')} >= 0" for c in block.constraints]
            self.open(f"if ({' && '.join(tests)})")
        views, frees = self.refinements(block, outer, own, here)
        self.statements(block, views, own, here)
        for f in frees:
            self.emit(f"free({f});")
        if block.constraints:
            self.close()
        for _ in block.idxs:
            self.close()
        self.close()

    def refinements(self, block: Block, outer: dict[str, View], own: dict[str, str], here: str):
        views: dict[str, View] = {}
        frees: list[str] = []
        for r in block.refs:
            if r.agg_op not in AGG_OPS:
                raise UnsupportedConstruct(f"refinement '{r.into}' with the agg_op '{r.agg_op}'", here)
            parent = outer.get(r.source)
            if parent is None:
                if r.dir is not RefDir.NONE or r.from_ is not None:
                    raise UnsupportedConstruct(
                        f"refinement '{r.into}' of '{r.source}', which the enclosing block does not have",
                        here,
                    )
                views[r.into] = self.local(r, here, frees)
                continue
            if len(r.access) != len(parent.dims):
                raise UnsupportedConstruct(
                    f"refinement '{r.into}' with {len(r.access)} access affines of the rank-"
                    f"{len(parent.dims)} '{r.source}'",
                    here,
                )
            offset = Affine()
            for a, d in zip(r.access, parent.dims):
                offset = offset + a * d.stride
            off = parent.off
            if offset != Affine():
                var = self.names("o", r.into)
                expr = self.affine(offset, own, here, f"the access of '{r.into}'")
                base = "" if parent.off == "0" else f"{parent.off} + "
                self.emit(f"const int64_t {var} = {base}{expr};")
                off = var
            views[r.into] = View(
                r.into, parent.buf, parent.buf_dtype, off, r.shape.dims, r.shape.dtype, r.agg_op
            )
        return views, frees

    def local(self, r: Refinement, here: str, frees: list[str]) -> View:
        """A fresh zeroed buffer for refinement ``r`` (one per point of its block)."""
        if any(d.stride < 0 for d in r.shape.dims):
            raise UnsupportedConstruct(f"the local buffer '{r.into}' with a negative stride", here)
        dims = r.shape.dims
        extent = 0 if any(d.size == 0 for d in dims) else 1 + sum((d.size - 1) * d.stride for d in dims)
        st = cexpr.storage(r.shape.dtype)
        var = self.names("l", r.into)
        nbytes = max(extent, 1) * r.shape.dtype.numpy.itemsize
        if nbytes <= LOCAL_STACK_BYTES:
            self.emit(f"{st} {var}[{max(extent, 1)}];")
            self.emit(f"memset({var}, 0, sizeof {var});")
        else:
            self.emit(f"{st} *{var} = ({st} *)calloc({max(extent, 1)}, sizeof({st}));")
            frees.append(var)
        return View(r.into, var, r.shape.dtype, "0", dims, r.shape.dtype, r.agg_op)

    def affine(self, a: Affine, names: dict[str, str], here: str, what: str) -> str:
        """``a`` as a C int64 expression of the index variables ``names``."""
        if not a.is_integral:
            raise UnsupportedConstruct(f"{what} with the non-integer affine '{a}'", here)
        terms = []
        for v, c in a.terms:
            if v not in names:
                raise UnsupportedConstruct(f"{what}, whose affine '{a}' uses '{v}', not an index here", here)
            terms.append(names[v] if c == 1 else f"{int(c)} * {names[v]}")
        if a.const != 0 or not terms:
            terms.append(f"INT64_C({int(a.const)})")
        return "(" + " + ".join(terms) + ")"

    # -------------------------------------------------------------------------- statements
    def statements(self, block: Block, views: dict[str, View], own: dict[str, str], here: str) -> None:
        scalars: dict[str, tuple[str, DType]] = {}

        def view(name: str, stmt) -> View:
            if name not in views:
                raise UnsupportedConstruct(
                    f"a {type(stmt).__name__} of refinement '{name}', which the block does not have", here
                )
            return views[name]

        def define(name: str, dt: DType, expr: str) -> None:
            if name in scalars:
                raise UnsupportedConstruct(f"a second assignment of the scalar '{name}'", here)
            var = self.names("v", name)
            self.emit(f"const {cexpr.ctype(dt)} {var} = {expr};")
            scalars[name] = (var, dt)

        def scalar(name: str) -> tuple[str, DType]:
            if name not in scalars:
                raise UnsupportedConstruct(f"a use of the scalar '{name}' before it is assigned", here)
            return scalars[name]

        for stmt in block.stmts:
            if isinstance(stmt, Load):
                v = view(stmt.from_, stmt)
                define(stmt.into, v.dtype, v.load())
            elif isinstance(stmt, Store):
                self.store(view(stmt.into, stmt), *scalar(stmt.from_))
            elif isinstance(stmt, LoadIndex):
                define(stmt.into, DType.INT64, self.affine(stmt.affine, own, here, "a load_index"))
            elif isinstance(stmt, Constant):
                stored = DType.FLOAT64 if stmt.dtype.is_float else stmt.dtype  # float literals stay exact
                define(stmt.into, stored, cexpr.literal(stmt.value, stored))
            elif isinstance(stmt, Intrinsic):
                if len(stmt.outputs) != 1:
                    raise UnsupportedConstruct(
                        f"the intrinsic '{stmt.name}' with {len(stmt.outputs)} outputs", here
                    )
                args = [scalar(a) for a in stmt.inputs]
                define(
                    stmt.outputs[0],
                    stmt.dtype,
                    cexpr.intrinsic(stmt.name, args, stmt.dtype, stmt.params, here),
                )
            elif isinstance(stmt, Special):
                self.open(comment(f"special {stmt.name}"))
                special(self, stmt, views, here)
                self.close()
            elif isinstance(stmt, Block):
                self.block(stmt, views, own)
            else:
                raise UnsupportedConstruct(f"the statement {type(stmt).__name__}", here)

    def store(self, v: View, expr: str, dt: DType) -> None:
        """Store a ``dt`` scalar into view ``v``'s base element through its ``agg_op``: converted
        to the refinement's type, then to the buffer's, and aggregated in the buffer's type."""
        if v.agg_op in ("", "assign"):
            self.emit(v.store("0", expr, dt))
            return
        value = cexpr.convert(cexpr.convert(expr, dt, v.dtype), v.dtype, v.buf_dtype)
        bdt = v.buf_dtype
        cur = f"(float){v.at('0')}" if bdt is DType.FLOAT16 else v.at("0")
        self.emit(f"{v.at('0')} = {cexpr.combine(v.agg_op, cur, value, bdt)};")


def _first_dtype(block: Block, name: str) -> DType:
    """A buffer's dtype where ``KernelInfo`` does not say: its first refinement's."""
    for r in block.refs:
        if r.source == name:
            return r.shape.dtype
    return DType.FLOAT32
