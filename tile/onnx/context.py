"""The program being built (``Builder``) and a converter's view of one node (``Context``).

Every statement a converter writes is typed at once by ``tile.bind`` on a small program of just
that statement (its inputs declared with their known types), so each ``Value`` carries the shape
and dtype Tile will give it, and a converter can branch on them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass

import numpy as np

from tile import ast
from tile.bind import bind
from tile.dtypes import DType
from tile.errors import TileError
from tile.onnx.errors import TileOnnxError, TileOnnxUnsupported, TileOnnxValueDependent
from tile.ops._build import lit as float_lit
from tile.parser import parse
from tile.typed import TensorType

_NAME = re.compile(r"\b[A-Z][A-Za-z0-9_]*'?")
REQUIRED = object()


@dataclass(frozen=True)
class Value:
    """A tensor of the program: its Tile ``name`` (``None`` for a constant not yet used as a
    tensor), static ``shape``, Tile ``dtype`` and, when known at import time, its ``const`` value."""

    name: str | None
    shape: tuple[int, ...]
    dtype: DType
    const: np.ndarray | None = None
    sources: frozenset[str] = frozenset()  # the graph inputs it is computed from
    carried: str | None = None  # the ONNX type it holds where Tile lacks it (tile.onnx.carried)

    def __str__(self) -> str:
        assert self.name is not None, "a lazy constant is materialized by Context.input"
        return self.name

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@functools.lru_cache(maxsize=512)
def _parsed(source: str) -> ast.Program:
    return parse(source, "<tile.ops source>")


def literal(x, dtype: DType) -> str:
    """Tile text for the number ``x`` with exactly the type ``dtype``."""
    if dtype is DType.BOOL:
        return f"as_bool({int(bool(x))})"
    if dtype.is_float:
        x = float(x)
        if math.isnan(x):
            text = "abs(0.0 / 0.0)"  # the positive quiet nan (0/0 has the sign bit set on x86)
        elif math.isinf(x):
            text = "(1.0 / 0.0)" if x > 0 else "(-1.0 / 0.0)"
        else:
            text = float_lit(x)
        if dtype is DType.FLOAT32:
            return text
        if dtype is DType.BFLOAT16:
            return f"as_bfloat({text}, 16)"
        return f"as_float({text}, {dtype.bits})"
    x = int(x)
    text = f"({x})" if x < 0 else str(x)
    if dtype is DType.INT32 and -(2**31) <= x < 2**31:
        return text
    return f"as_{'int' if dtype.is_signed else 'uint'}({text}, {dtype.bits})"


def cast_text(name: str, dtype: DType) -> str:
    """Tile text converting tensor ``name`` to ``dtype``."""
    if dtype is DType.BOOL:
        return f"as_bool({name})"
    if dtype is DType.BFLOAT16:
        return f"as_bfloat({name}, 16)"
    if dtype.is_float:
        return f"as_float({name}, {dtype.bits})"
    return f"as_{'int' if dtype.is_signed else 'uint'}({name}, {dtype.bits})"


class Builder:
    """The one function being written: its statements, the types of its tensors, its constant
    inputs (name -> array, fed by the caller) and a name allocator."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, str, frozenset[str]]] = []  # (defined name, text, names read)
        self.types: dict[str, TensorType] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.pack = False  # lay constants out for speed (import_model's ``pack``)
        self.channels_last: dict[str, Value] = {}  # channels-first name -> its channels-last copy (layout)
        self.panels: dict[str, Value] = {}  # row-major name -> its panel-major copy (panels)
        self.views: dict[str, tuple] = {}  # name -> (source Value, index map) of a reshape/permute (views)
        self.merges: dict[str, tuple] = {}  # name -> (source Value, merged sizes per axis) (views)
        self._used: set[str] = set()
        self._count = 0

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", hint) or "T"
        if not base[0].isalpha():
            base = "T" + base
        base = base[0].upper() + base[1:]
        if base not in self._used and not base[-1].isdigit():
            self._used.add(base)
            return base
        while True:
            self._count += 1
            name = f"{base}_{self._count}" if base[-1].isdigit() else f"{base}{self._count}"
            if name not in self._used:
                self._used.add(name)
                return name

    def reserve(self, name: str) -> None:
        self._used.add(name)

    def materialize(self, v: Value, hint: str = "C") -> Value:
        """``v`` as a tensor of the program: a 0-D constant as a literal statement, any other as a
        constant input."""
        if v.name is not None:
            return v
        assert v.const is not None
        name = self.fresh(hint)
        if v.rank == 0 and v.dtype is not DType.BFLOAT16:
            self.add([f"{name} = {literal(v.const.item(), v.dtype)}"])
        else:
            self.consts[name] = np.ascontiguousarray(v.const)
            self.types[name] = TensorType(v.dtype, v.shape)
        return Value(name, v.shape, v.dtype, v.const, v.sources, v.carried)

    def add(self, lines: list[str]) -> None:
        """Append statements after typing them (``tile.bind`` on a program of just these lines)."""
        text = "\n".join(f"    {s.rstrip().rstrip(';')};" for s in lines)
        defined = {_NAME.match(s.strip()).group(0) for s in lines}
        refs = sorted({n for n in _NAME.findall(text) if n in self.types and n not in defined})
        program = parse(f"function ({', '.join(refs)}) -> ({', '.join(sorted(defined))}) {{\n{text}\n}}\n")
        bound = bind(program, {n: self.types[n] for n in refs})
        for s in program.stmts:
            self.types[s.name] = bound.types[s.name]
        for line in text.split("\n"):
            name = _NAME.match(line.strip()).group(0)
            self.statements.append((name, line, frozenset(_NAME.findall(line)) - {name}))

    def text(self, inputs: list[str], outputs: list[str]) -> str:
        """The function of the statements written so far. Each input declares its dims, named by
        their sizes (``X[N4, N8]``: equal sizes share a name, true of this static program), so
        that ``tile.grad`` of the program without ``shapes=`` knows every rank and which sizes agree
        (undeclared, a tensor broadcast with an input of unknown rank had unknown dims, and its
        gradient's sizes named nothing). Statements no output depends on are left out: a converter
        may write a tensor that a later one makes unneeded (``layout``'s channels-first copies), and
        a compiled target then fuses what reads the rest (a ReLU into its convolution's kernel)."""
        live, kept = set(outputs), []
        for name, line, reads in reversed(self.statements):
            if name in live:
                kept.append(line)
                live |= reads
        body = "\n".join(reversed(kept))
        prefix = "N"
        while any(re.fullmatch(rf"{prefix}\d+", u) for u in self._used):
            prefix += "_"
        declared = [f"{n}[{', '.join(f'{prefix}{d}' for d in self.types[n].shape)}]" for n in inputs]
        return f"function ({', '.join(declared)}) -> ({', '.join(outputs)}) {{\n{body}\n}}\n"

    def value(self, name: str) -> Value:
        t = self.types[name]
        return Value(name, tuple(int(d) for d in t.shape), t.dtype)


class Context:
    """One node's view of the program being built (the converter contract is in ``registry``)."""

    def __init__(self, builder: Builder, node, values: dict, opset: int):
        self.b = builder
        self.node = node
        self.values = values  # ONNX value name -> Value
        self.opset = opset
        self._attrs = {a.name: a for a in node.attribute}

    # ---------------------------------------------------------------- naming the node
    @property
    def where(self) -> str:
        name = f" '{self.node.name}'" if self.node.name else ""
        return f"{self.node.op_type} node{name} (output '{self.node.output[0] if self.node.output else ''}')"

    def error(self, message: str, hint: str | None = None) -> TileOnnxError:
        return TileOnnxError(f"{self.where}: {message}", None, hint)

    def unsupported(self, message: str) -> TileOnnxUnsupported:
        return TileOnnxUnsupported(f"{self.where}: {message}", None,
                                   "tile.onnx.registry.supported() lists the operators it converts")

    # ---------------------------------------------------------------- inputs and attributes
    @property
    def n_inputs(self) -> int:
        return len(self.node.input)

    def has(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def raw(self, i: int) -> Value | None:
        """Input ``i`` as it is (a constant stays unmaterialized), ``None`` if absent."""
        if not self.has(i):
            return None
        return self.values[self.node.input[i]]

    def input(self, i: int) -> Value | None:
        """Input ``i`` as a tensor of the program (``None`` if absent)."""
        v = self.raw(i)
        if v is None or v.name is not None:
            return v
        v = self.b.materialize(v, self.node.input[i])
        self.values[self.node.input[i]] = v
        return v

    def inputs(self) -> list[Value | None]:
        return [self.input(i) for i in range(self.n_inputs)]

    def const(self, i: int, default=None) -> np.ndarray | None:
        """The value of input ``i`` (``default`` if absent); refused when known only at run time."""
        v = self.raw(i)
        if v is None:
            return default
        if v.const is None:
            name = self.node.input[i]
            raise TileOnnxValueDependent(
                f"{self.where}: its output shape depends on the value of input '{name}', which is known "
                "only at run time", tuple(sorted(v.sources)) or (name,),
                hint=f"make '{name}' an initializer or a Constant (the backend does so with the value it "
                     "is given)")
        return v.const

    def attr(self, name: str, default=REQUIRED):
        a = self._attrs.get(name)
        if a is None:
            if default is REQUIRED:
                raise self.error(f"the attribute '{name}' is required")
            return default
        from onnx import helper, numpy_helper

        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list):
            return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
        if hasattr(value, "data_type") and hasattr(value, "dims"):
            return numpy_helper.to_array(value)
        return value

    # ---------------------------------------------------------------- writing Tile
    def lit(self, x, dtype: DType) -> str:
        return literal(x, dtype)

    def let(self, expr: str, hint: str | None = None) -> Value:
        name = self.b.fresh(hint or self.node.op_type)
        self._add([f"{name} = {expr}"])
        return self.b.value(name)

    def emit(self, stmt: str, hint: str | None = None) -> Value:
        """A statement with ``$`` for the new tensor's name (a contraction, usually)."""
        name = self.b.fresh(hint or self.node.op_type)
        self._add([stmt.replace("$", name)])
        return self.b.value(name)

    def cast(self, v: Value, dtype: DType) -> Value:
        """``v`` as ``dtype`` (a value of a carried type, ``tile.onnx.carried``, becomes a plain one)."""
        if v.dtype is dtype:
            return dataclasses.replace(v, carried=None) if v.carried else v
        return self.let(cast_text(v.name, dtype), "Cast")

    def constant(self, array: np.ndarray, dtype: DType | None = None) -> Value:
        """A constant tensor of the program (materialized now)."""
        return self.b.materialize(self.folded(array, dtype), "C")

    def folded(self, array, dtype: DType | None = None) -> Value:
        """A value known at import time, kept as a constant until something uses it as a tensor."""
        array = np.asarray(array)
        dtype = dtype or DType.of(array.dtype)
        array = array.astype(dtype.numpy)
        return Value(None, tuple(array.shape), dtype, array)

    def call(self, source: str, *args: Value) -> list[Value]:
        """Inline the ``tile.ops`` function ``source`` with its inputs bound to ``args`` (in header
        order) and its dims to their static sizes; returns its outputs' values."""
        fn = _parsed(source)
        if len(fn.inputs) != len(args):
            raise self.error(f"internal: op takes {len(fn.inputs)} inputs, given {len(args)}")
        subst: dict[str, ast.Expr] = {}
        for inp, arg in zip(fn.inputs, args):
            subst[inp.name] = ast.Name(arg.name)
            if inp.dims is not None:
                if len(inp.dims) != arg.rank:
                    raise self.error(f"internal: op input {inp.name} has rank {len(inp.dims)}, "
                                     f"given {arg.rank}")
                for d, size in zip(inp.dims, arg.shape):
                    subst[d] = ast.IntLit(size)
        for s in fn.stmts:
            subst[s.name] = ast.Name(self.b.fresh(f"{self.node.op_type}_{s.name}"))
        lines = [ast.format_statement(ast.rename_statement(s, subst)).strip() for s in fn.stmts]
        self._add(lines)
        return [self.b.value(subst[o.name].name) for o in fn.outputs]

    def _add(self, lines: list[str]) -> None:
        try:
            self.b.add(lines)
        except TileError as e:
            raise TileOnnxError(f"{self.where}: Tile refused the converted statements: {e.message}", None,
                                e.hint) from e


__all__ = ["Builder", "Context", "REQUIRED", "Value", "cast_text", "literal"]
