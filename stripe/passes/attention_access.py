"""What the ``attention`` pass's matcher (``attention_match``) reads of a kernel: the chain found so
far (``Chain``: its temporaries, the roles of their dims), and the small readings of one kernel it
is built from: a fill, one index per access dim, the leaf statements, a scalar's definition, the
role of each index (``roles_of``), constraints as role affines (``mask_of``). ``Miss`` ends a match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from stripe.ir import (
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
)
from tile.dtypes import DType

FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
ZERO = "_0"  # the role of an access dim that is constant 0 (a dim of size 1)


class Miss(Exception):
    """The run is not an attention chain (internal: the matcher gives up)."""


@dataclass
class Chain:
    s: str = ""  # the scores' buffer
    p: str = ""  # the last score (S, or the last score kernel's output)
    batch: list[tuple[str, int]] = field(default_factory=list)
    rows: int = 0
    keys: int = 0
    depth: int = 0
    width: int = 0
    q: str = ""
    k: str = ""
    v: str = ""
    o: str = ""
    q_dims: tuple[str, ...] = ()
    k_dims: tuple[str, ...] = ()
    v_dims: tuple[str, ...] = ()
    o_dims: tuple[str, ...] = ()
    scores: list[str] = field(default_factory=list)  # the score kernels' names
    mask: tuple | None = None  # the max's constraints as role affines (frozenset)
    scale: Fraction = Fraction(1)
    temps: set[str] = field(default_factory=set)  # S, scores, Mx (and its parts), E, Z, O1
    filled: set[str] = field(default_factory=set)
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # temp -> its dims' roles
    stage: str = "scores"  # what comes next: scores, max, flag, exp, sums, div, done
    mx: str = ""
    acc: str = ""  # a masked max's accumulator and written-flag
    flag: str = ""
    e: str = ""
    z: str = ""
    o1: str = ""
    w: str = ""  # normalized weights E / Z, when O sums them against V
    ranges: dict[str, int] = field(default_factory=dict)  # the scores kernel's index ranges
    d: str = ""  # its reduced index


def fill_of(b: Block, parent: Block) -> str | None:
    if b.idxs or b.constraints or len(b.stmts) != 1 or len(b.refs) != 1:
        return None
    s, r = b.stmts[0], b.refs[0]
    if not isinstance(s, Special) or s.inputs or s.outputs != (r.into,):
        return None
    if s.name not in ("zero", "agg_init_max") or any(not (a.is_constant and a.const == 0) for a in r.access):
        return None
    try:
        whole = parent.ref(r.source)
    except KeyError:
        return None
    return r.source if r.shape == whole.shape and r.dir is RefDir.OUT else None


def vars_of(a_access, ranges: dict[str, int]) -> tuple[str | None, ...]:
    """Each access dim's one index (coefficient 1, no constant), or None for a constant 0."""
    out: list[str | None] = []
    for a in a_access:
        if a.is_constant and a.const == 0:
            out.append(None)
        elif len(a.vars) == 1 and a.coeff(a.vars[0]) == 1 and a.const == 0 and a.vars[0] in ranges:
            out.append(a.vars[0])
        else:
            raise Miss
    return tuple(out)


def leaf_parts(b: Block):
    """(inputs, output) refinements of a leaf kernel with one output, or raise ``Miss``."""
    if not all(isinstance(s, (Load, Store, Constant, Intrinsic, LoadIndex)) for s in b.stmts):
        raise Miss
    ins = [r for r in b.refs if r.dir is RefDir.IN]
    outs = [r for r in b.refs if r.dir is not RefDir.IN]
    if any(r.dir is not RefDir.OUT for r in outs):
        raise Miss
    return ins, outs


def scalar_defs(b: Block) -> dict[str, object]:
    """Each scalar's defining statement."""
    out: dict[str, object] = {}
    for s in b.stmts:
        if isinstance(s, (Load, LoadIndex, Constant)):
            out[s.into] = s
        elif isinstance(s, Intrinsic):
            out[s.outputs[0]] = s
    return out


def stored_from(b: Block, into: str) -> str:
    stores = [s for s in b.stmts if isinstance(s, Store) and s.into == into]
    if len(stores) != 1:
        raise Miss
    return stores[0].from_


def load_of(defs, scalar: str) -> str | None:
    s = defs.get(scalar)
    return s.from_ if isinstance(s, Load) else None


def whole_ref(parent: Block, r: Refinement) -> Refinement:
    """``parent``'s refinement that ``r`` refines, which must be a whole buffer at offset 0."""
    try:
        whole = parent.ref(r.source)
    except KeyError:
        raise Miss from None
    if any(not (a.is_constant and a.const == 0) for a in whole.access) or whole.from_ is not None:
        raise Miss
    return whole


def roles_of(b: Block, ch: Chain, known: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """``b``'s index -> role, from its accesses of the chain's buffers ``known`` (buffer -> its
    dims' roles); an index with two roles, or a chain access that is not one index per dim, misses."""
    ranges = {ix.name: ix.range for ix in b.idxs}
    roles: dict[str, str] = {}
    for r in b.refs:
        if r.source not in known:
            continue
        for v, role in zip(vars_of(r.access, ranges), known[r.source], strict=True):
            if v is None or role == ZERO:
                if v is not None and ranges[v] != 1:
                    raise Miss
                continue
            if roles.setdefault(v, role) != role:
                raise Miss
    if len(set(roles.values())) != len(roles):
        raise Miss
    return roles


def at_point(b: Block, r: Refinement, roles: dict[str, str], dims: tuple[str, ...]) -> bool:
    """Whether ``r`` is read or written at ``b``'s point with the roles ``dims`` (one index each)."""
    ranges = {ix.name: ix.range for ix in b.idxs}
    vs = vars_of(r.access, ranges)
    return all((v is None and d == ZERO) or (v is not None and roles.get(v) == d) or
               (v is not None and d == ZERO and ranges[v] == 1) for v, d in zip(vs, dims, strict=True))


def mask_of(b: Block, roles: dict[str, str]) -> frozenset:
    """``b``'s constraints as affines of the roles."""
    out = []
    for c in b.constraints:
        if not c.is_integral or any(v not in roles for v in c.vars):
            raise Miss
        out.append((tuple(sorted((roles[v], int(c.coeff(v))) for v in c.vars)), int(c.const)))
    return frozenset(out)


def assign_of_load(defs, scalar: str) -> bool:
    s = defs.get(scalar)
    return isinstance(s, Intrinsic) and s.name == "assign" and load_of(defs, s.inputs[0]) is not None
