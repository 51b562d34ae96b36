"""The Stripe IR: nested blocks of indexes and constraints over refinements of tensors.

A **Block** runs its statements once for every point of its index space: each ``Index`` ranges
over ``[start, start + range)`` where ``start`` is its ``affine`` of the enclosing block's index
values (0 when it has none), and the point must satisfy every ``constraint`` (an affine of the
block's own indexes that must be ``>= 0``). Points may run in any order, in parallel; within one
point the statements run in order.

A **Refinement** is a view of a buffer. A block's refinement ``into`` refines the enclosing
block's refinement ``from_`` (the same name when ``from_`` is None); its base element is the
parent's base plus ``Σ_d access[d] * parent.shape.dims[d].stride``, with ``access`` affines of the
block's indexes, and its ``shape`` gives the element type and ``(size, stride)`` per dimension
(strides in elements of the underlying buffer). The root block's refinements, with ``dir`` NONE
and no ``from_``, are the program's buffers (dense row-major, access all zero). A refinement with
an ``agg_op`` accumulates what is stored into it: ``add``, ``mul``, ``max``, ``min``, or ``assign``
(overwrite). A refinement's ``offset`` (None until memory placement sets it) is the byte offset of
an allocation (a root buffer or a local allocation) in the arena of its location: allocations of
one location that are live at the same time never overlap. Executors ignore it; placement is a
promise about addresses that a backend may use instead of allocating each buffer on its own.

Statements: ``Load`` a scalar from a refinement's base element, ``Store`` a scalar to it (through
its ``agg_op``), ``LoadIndex`` an affine of the block's indexes, ``Constant``, ``Intrinsic`` (an
elementwise builtin of ``tile.builtins`` by name, or ``assign``, on scalars, computing in
``dtype``), ``Special`` (a whole-buffer operation on refinements: ``zero``, ``copy``,
``agg_init_<op>``, ``reshape``, ``gather``, ``scatter``, ``builtin_softmax`` …) and nested
``Block``s. Scalar names start with ``$``, are assigned once, and are local to their block.

A block's ``plan`` (None, or one of ``stripe.plans``) is what the pass that shaped it for a special
code generator declares about it (a GEMM nest's index roles and tiles, a row program's row values,
a combine's lanes); executors ignore it.

Affines reuse ``tile.affine.Affine`` (exact), and must have integer coefficients here.

Buffers other than inputs start as zeros. A refinement with dir NONE and no ``from_`` that names
nothing in the enclosing block is a local allocation: a fresh zero buffer for each point of its
block. A refinement whose dtype differs from its buffer's converts on load and store. Specials
overwrite their outputs (they ignore ``agg_op``); their operands are whole views: ``zero(O)``,
``copy(I -> O)``, ``agg_init_<op>(O)``, ``reshape(I -> O)``, ``gather(D, I -> O)``,
``scatter(V, I[, L] -> O)``, ``shape(T -> O)``, ``builtin_softmax(X -> O)``,
``builtin_logsoftmax(X -> O)``. Float ``Constant`` values are doubles: a lowered Tile literal is
the double nearest its decimal (the Tile interpreter's ``exact`` mode keeps the decimal exact).

A **program** is a root block tagged ``program`` whose refinements (dir NONE) are every buffer,
tagged ``user`` plus ``input`` or ``output`` for the Tile function's parameters, or ``tmp``;
its one statement is the block tagged ``main``, which refines them (``in``, ``out``, ``inout``)
and holds one block tagged ``kernel`` per operation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum

from tile.affine import Affine
from tile.dtypes import DType
from tile.errors import TileRuntimeError

AGG_OPS = ("", "assign", "add", "mul", "max", "min")

# Short dtype spellings of the text format (as in the slides: ``i8``, ``fp32``).
DTYPE_NAMES = {
    DType.BOOL: "bool",
    DType.INT8: "i8",
    DType.INT16: "i16",
    DType.INT32: "i32",
    DType.INT64: "i64",
    DType.UINT8: "u8",
    DType.UINT16: "u16",
    DType.UINT32: "u32",
    DType.UINT64: "u64",
    DType.FLOAT16: "fp16",
    DType.BFLOAT16: "bf16",
    DType.FLOAT32: "fp32",
    DType.FLOAT64: "fp64",
}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}


class RefDir(Enum):
    NONE = "none"  # an allocation (or a plain view)
    IN = "in"
    OUT = "out"
    INOUT = "inout"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a block runs or a buffer lives: ``DRAM``, ``GPU[0]``, ``SRAM[i]``."""

    name: str
    units: tuple[Affine, ...] = ()


@dataclass(frozen=True, slots=True)
class Dim:
    size: int
    stride: int


class Shaped:
    """``sizes`` and ``elements`` of anything with ``dims`` (shapes, and the executors' views)."""

    __slots__ = ()
    dims: tuple[Dim, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d.size
        return n


def dense_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of a buffer of ``sizes`` (the last dim contiguous)."""
    strides, n = [], 1
    for s in reversed(sizes):
        strides.append(n)
        n *= s
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class TensorShape(Shaped):
    dtype: DType
    dims: tuple[Dim, ...]

    @staticmethod
    def dense(dtype: DType, sizes: tuple[int, ...]) -> TensorShape:
        """Row-major strides."""
        return TensorShape(dtype, tuple(Dim(n, k) for n, k in zip(sizes, dense_strides(sizes))))

    def scalar_view(self) -> TensorShape:
        """Every size 1, the strides kept: the view one index point reads or writes."""
        return TensorShape(self.dtype, tuple(Dim(1, d.stride) for d in self.dims))


@dataclass(frozen=True, slots=True)
class Refinement:
    dir: RefDir
    into: str
    access: tuple[Affine, ...]
    shape: TensorShape
    from_: str | None = None
    agg_op: str = ""
    location: Location | None = None
    is_const: bool = False
    tags: frozenset[str] = frozenset()
    offset: int | None = None  # the arena byte offset memory placement gave an allocation

    @property
    def source(self) -> str:
        return self.from_ or self.into


@dataclass(frozen=True, slots=True)
class Index:
    name: str
    range: int
    affine: Affine | None = None


@dataclass(frozen=True, slots=True)
class Load:
    from_: str  # refinement
    into: str  # $scalar


@dataclass(frozen=True, slots=True)
class Store:
    from_: str  # $scalar
    into: str  # refinement


@dataclass(frozen=True, slots=True)
class LoadIndex:
    affine: Affine
    into: str  # $scalar, int64


@dataclass(frozen=True, slots=True)
class Constant:
    into: str  # $scalar
    value: int | float
    dtype: DType


@dataclass(frozen=True, slots=True)
class Intrinsic:
    name: str  # a tile.builtins name (add, mul, cmp_eq, cond, exp, ...) or "assign"
    inputs: tuple[str, ...]  # $scalars
    outputs: tuple[str, ...]  # $scalars (one)
    dtype: DType  # the result type
    params: tuple[int, ...] = ()  # compile-time integers (as_int's width, ...)


@dataclass(frozen=True, slots=True)
class Special:
    name: str
    inputs: tuple[str, ...]  # refinements
    outputs: tuple[str, ...]  # refinements
    int_params: tuple[int, ...] = ()
    str_params: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Block:
    name: str = ""
    idxs: tuple[Index, ...] = ()
    constraints: tuple[Affine, ...] = ()  # each >= 0
    refs: tuple[Refinement, ...] = ()
    stmts: tuple[Statement, ...] = ()
    tags: frozenset[str] = frozenset()
    comments: tuple[str, ...] = ()
    location: Location | None = None
    attrs: tuple[tuple[str, int | float | str | bool], ...] = ()
    plan: object | None = None  # a stripe.plans plan: the hand-off of the pass that shaped it

    def ref(self, name: str) -> Refinement:
        for r in self.refs:
            if r.into == name:
                return r
        raise KeyError(name)

    def has_tags(self, *tags: str) -> bool:
        return all(t in self.tags for t in tags)

    @property
    def index_space(self) -> int:
        n = 1
        for i in self.idxs:
            n *= i.range
        return n


Statement = Load | Store | LoadIndex | Constant | Intrinsic | Special | Block


_last_table: tuple[Block | None, dict[str, Refinement]] = (None, {})


def ref_table(block: Block) -> dict[str, Refinement]:
    """``{into: refinement}`` of ``block`` (the first of a name, as ``Block.ref`` finds it); not to
    be changed. Checks ask about each refinement of a nested block against one parent in turn, and
    ``#main`` of a long program has thousands, so the last table is kept."""
    global _last_table
    last = _last_table  # read once: another thread may replace it meanwhile
    if last[0] is block:
        return last[1]
    table: dict[str, Refinement] = {}
    for r in block.refs:
        table.setdefault(r.into, r)
    _last_table = (block, table)
    return table


_FIELDS: dict[type, tuple[str, ...]] = {}
_new = object.__new__
_set = object.__setattr__


def evolve(node, **changes):
    """``dataclasses.replace`` for the IR's frozen, slotted node classes (none has an
    ``__post_init__`` or an ``init=False`` field), at about half its cost: passes over programs of
    thousands of statements call it hundreds of thousands of times."""
    cls = type(node)
    names = _FIELDS.get(cls)
    if names is None:
        assert not hasattr(cls, "__post_init__") and all(f.init for f in fields(cls)), cls
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls))
    new = _new(cls)
    for n in names:
        _set(new, n, changes.pop(n) if n in changes else getattr(node, n))
    if changes:
        raise TypeError(f"{cls.__name__} has no field {sorted(changes)}")
    return new


def with_stmts(block: Block, stmts: list[Statement] | tuple[Statement, ...]) -> Block:
    return replace(block, stmts=tuple(stmts))


def walk(block: Block):
    """Every block of the tree, parents before children."""
    yield block
    for s in block.stmts:
        if isinstance(s, Block):
            yield from walk(s)


__all__ = [
    "AGG_OPS",
    "DTYPE_NAMES",
    "DTYPES_BY_NAME",
    "Affine",
    "Block",
    "Constant",
    "Dim",
    "Index",
    "Intrinsic",
    "Load",
    "LoadIndex",
    "Location",
    "RefDir",
    "Refinement",
    "Special",
    "Statement",
    "Store",
    "TensorShape",
    "dense_strides",
    "evolve",
    "walk",
    "with_stmts",
]


def where(block: Block) -> str:
    """How messages name a block: by name, else by its tags."""
    if block.name:
        return f"block '{block.name}'"
    tags = " ".join(f"#{t}" for t in sorted(block.tags))
    return f"a block {tags}" if tags else "an unnamed block"


def block_error(block: Block, message: str, hint: str) -> TileRuntimeError:
    """An executor's error about ``block`` (Stripe has no source location to point at)."""
    return TileRuntimeError(f"{where(block)}: {message}", None, hint=hint)
