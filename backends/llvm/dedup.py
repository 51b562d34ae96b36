"""Kernels that differ only in names are built once: a program of many alike statements (a chain of
8x8 products, a thousand independent matmuls) has thousands of kernels but a handful of distinct ones.

A kernel's code depends on its Stripe block, on which of its buffers sit at which position of the
buffer table it is called with, on their dtypes, and (``codegen._zero_fill_of``) on whether it is a
zero fill the next kernel's micro-kernel may take over. ``unit_key`` writes a *unit* (one kernel,
or a fill and the contraction after it, which ``codegen.generate`` builds together) as the text of
every field of its IR nodes (``_write``: block names, comments and locations dropped), every
refinement, index and scalar name replaced by a canonical one in order of first appearance (the
kernels' buffers first, in table order), and the dtypes added. Only name fields are renamed: a
string where an operation, aggregation, tag, memory or parameter stands (``symbolic.LITERAL``) is
written as it is, so an index called ``mul`` never makes a product look like a sum whose index is
called ``add``. Names are only looked up in the code generator, so two units with the same key generate
the same code up to names; the buffers reach the function through its table by position, so one
function serves every such unit with its own buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import replace

from backends.hal import KernelInfo
from backends.llvm.codegen import units
from backends.llvm.symbolic import LITERAL
from stripe.ir import Block

_DROPPED = frozenset({("Block", "name"), ("Block", "comments"), ("Block", "location")})  # never in code
_FIELDS: dict[type, tuple[tuple[str, bool], ...] | None] = {}  # a dataclass -> (field, literal) pairs


def _fields(t: type) -> tuple[tuple[str, bool], ...] | None:
    """How ``_write`` walks a node of type ``t`` (None: not a dataclass), worked out once per type."""
    if t not in _FIELDS:
        out = None
        if dataclasses.is_dataclass(t):
            n = t.__name__
            out = tuple((f.name, (n, f.name) in LITERAL) for f in dataclasses.fields(t)
                        if (n, f.name) not in _DROPPED)
        _FIELDS[t] = out
    return _FIELDS[t]


def _write(x, out: list[str], name, literal: bool) -> None:
    """Every field of ``x`` as text, a string through ``name`` unless ``literal`` (then quoted)."""
    t = type(x)
    if t is str:
        out.append(repr(x) if literal else name(x))
    elif t is tuple:
        out.append("(")
        for y in x:
            _write(y, out, name, literal)
            out.append(",")
        out.append(")")
    elif t is frozenset:
        out.append(repr(sorted(map(repr, x))))
    else:
        fields = _fields(t)
        if fields is None:
            out.append(repr(x))  # int, Fraction, float, bool, None, an Enum, a dtype
            return
        out.append(t.__name__ + "(")
        for f, lit in fields:
            _write(getattr(x, f), out, name, lit or literal)
            out.append(";")
        out.append(")")


def _names(block: Block, out: set[str]) -> set[str]:
    """Every refinement and index name of ``block`` and its nested blocks."""
    out.update(ix.name for ix in block.idxs)
    for r in block.refs:
        out.add(r.into)
        if r.from_:
            out.add(r.from_)
    for s in block.stmts:
        if isinstance(s, Block):
            _names(s, out)
    return out


def unit_key(unit: Sequence[KernelInfo], dtypes: Sequence[dict]) -> str:
    """The canonical text of the kernels ``unit`` (``dtypes``: each one's buffer name -> dtype, as
    ``codegen.buffer_dtypes`` gives them): equal for units that generate the same code."""
    canon: dict[str, str] = {}
    for info in unit:
        for b in info.buffers:
            canon.setdefault(b, f"%{len(canon)}")
    names: set[str] = set(canon)
    for info in unit:
        _names(info.block, names)  # type: ignore[arg-type]

    def name(tok: str) -> str:
        if tok.startswith("$"):  # scalars: their own namespace
            return canon.setdefault(tok, f"$%{len(canon)}")
        return canon.setdefault(tok, f"%{len(canon)}") if tok in names else repr(tok)

    parts = []
    for info, dts in zip(unit, dtypes):
        text: list[str] = []
        _write(info.block, text, name, False)
        table = ",".join(f"{canon[b]}:{dts.get(b, '')}" for b in info.buffers)
        parts.append(f"buffers {table}\n{''.join(text)}")
    return "\n".join(parts)


def joint_key(unit: Sequence[KernelInfo], keys: Sequence[str]) -> str:
    """``unit_key`` of a unit from its kernels' own keys (``unit_key`` of each alone): each key with
    its kernel's buffers numbered in the unit's order of first use. Names inside a kernel are its
    own, so two units generate the same code when each kernel's key is the same and they share
    buffers alike (a zero fill and the product it feeds); one kernel's key serves its plan
    (``LlvmCompiler._plan`` plans each distinct kernel once) and its unit's."""
    canon: dict[str, int] = {}
    parts = []
    for info, key in zip(unit, keys):
        table = ",".join(str(canon.setdefault(b, len(canon))) for b in info.buffers)
        parts.append(f"shares {table}\n{key}")
    return "\n".join(parts)


def representatives(keys: Sequence[str]) -> list[int]:
    """For each key, the position of its first occurrence (its own when it is the first)."""
    first: dict[str, int] = {}
    return [first.setdefault(key, u) for u, key in enumerate(keys)]


def alike_code(code: KernelInfo, rep: KernelInfo, info: KernelInfo) -> KernelInfo | None:
    """What ``_plan`` gives ``info`` to build when kernel ``rep``, the same up to names (the same
    ``dedup.unit_key``), was planned as ``code``: ``info`` itself where ``rep`` runs as it is, else
    ``code``'s block (a nest's flat GEMM) with its kernel-level refinements viewing ``info``'s
    buffers in place of ``rep``'s (``codegen.units`` pairs a zero fill with the product after it
    by those); None where a refinement names a buffer without viewing it (then plan ``info``)."""
    if code is rep:
        return info
    to = dict(zip(rep.buffers, info.buffers))
    refs = []
    for r in code.block.refs:  # type: ignore[union-attr]
        if r.from_ is None:
            if to.get(r.into, r.into) != r.into:
                return None
            refs.append(r)
        else:
            refs.append(replace(r, from_=to.get(r.from_, r.from_)))
    return replace(info, block=replace(code.block, refs=tuple(refs)))


def shared_kernels(
    kernels: Sequence[KernelInfo], code: Sequence[KernelInfo], own: Sequence[str]
) -> tuple[list[int], list[str]]:
    """For each kernel, the first kernel that generates the same code (``dedup``), and each unit's
    key: kernels are built as ``codegen.units`` of ``code`` (what ``generate`` builds together),
    each unit keyed by its original kernels' own keys ``own`` (``dedup.unit_key`` of each alone),
    from which its schedule, nest and epilogue were derived."""
    groups = units(code)
    keys = [joint_key([kernels[j] for j in u], [own[j] for j in u]) for u in groups]
    out = list(range(len(kernels)))
    for u, rep in zip(groups, representatives(keys)):
        for pos, j in enumerate(u):
            out[j] = groups[rep][pos]
    return out, keys
