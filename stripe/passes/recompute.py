"""``recompute``: an elementwise kernel's temporary is recomputed inside the kernels that read it,
where that moves no more memory than reading it, and the kernel and the temporary go.

A softmax written in Tile, ``E = exp(X - Mx); S[i] = +(E[i, j]); Y = E / S``, writes ``E`` (a
whole pass over memory) only for the sum and the division to read it back (two more). Here each
read of ``E`` becomes ``exp(X - Mx)`` at that point: the sum reads ``X`` and ``Mx`` in place of
``E``, as does the division, and ``E`` is never written. The division then recomputes its cheap
producer instead of reading a materialised temporary.

The rule, per producer ``P`` (a child kernel of a block carrying ``reqs`` that carries
``producer_reqs``) writing the temporary ``T``:

* ``P`` is a leaf without constraints or index affines (loads, constants, ``load_index``, at most
  ``max_ops`` intrinsics, one plain store) writing every element of ``T`` once: each dim of its
  ``T`` access is one of its indexes (coefficient 1, each in one dim) whose range is the dim's size;
  ``T`` is a ``tmp`` buffer of the root that ``P`` views whole, with its own strides;
* **memory**: at most one of ``P``'s inputs is read at the full rate (its access uses every index
  of ``P``), with elements no larger than ``T``'s; the others are broadcast (a row max), served from
  cache. So a read of ``T`` becomes at most one read as large, plus the small ones;
* every other kernel naming ``T`` comes after ``P``, reads it through plain loads only (a leaf
  block of loads, stores, constants, intrinsics, ``load_index``, no nested blocks or specials), and
  runs at most as many points as ``T`` has elements (a consumer reading each element of ``T`` many
  times, a matrix product, would recompute it each time);
* no kernel from ``P`` to the last reader writes a buffer ``P`` reads, so the recomputed values
  are ``P``'s; and ``P``'s final value has ``T``'s dtype (the stored value needs no conversion).

Each load of ``T`` (at the consumer's access ``a``) becomes ``P``'s statements with ``P``'s index
``i_d`` replaced by ``a_d`` (its scalars renamed apart), reading ``P``'s inputs through new
refinements of the same parent views. Then ``P`` and ``T`` are dropped. Guarantees: every output
gets the same values, computed by the same operations in the same order per element (nothing is
reassociated: strict mode runs it too). Chains recompute from the last producer backwards over
repeated rounds until none applies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Statement,
    Store,
)
from stripe.passes.cleanup import drop_unused_tmps
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, fresh, matches, rewrite, scalars_of
from tile.affine import Affine

_LEAF = (Load, Store, Constant, Intrinsic, LoadIndex)


@dataclass(frozen=True)
class RecomputeConfig:
    reqs: tuple[str, ...]  # the blocks (``main``) whose child kernels are looked at
    producer_reqs: tuple[str, ...] = ("eltwise",)  # the producers recomputed
    max_ops: int = 4  # at most this many intrinsics in a producer (each reader redoes them)


@register("recompute", RecomputeConfig)
def recompute(program: Block, cfg: RecomputeConfig, hw: Hardware) -> Block:
    """Recomputes every qualifying producer in its readers, as the module docstring says."""
    tmps = {r.into for r in program.refs if "tmp" in r.tags}

    def visit(block: Block, ctx: Context) -> Block | None:
        stmts = list(block.stmts)
        changed = False
        for _ in range(len(stmts)):  # each round removes one producer at least, or stops
            got = _one_round(stmts, block, tmps, cfg)
            if got is None:
                break
            stmts, changed = got, True
        return replace(block, stmts=tuple(stmts)) if changed else None

    out = rewrite(program, visit, cfg.reqs)
    return drop_unused_tmps(out) if out is not program else program


def _one_round(stmts: list[Statement], parent: Block, tmps: set[str], cfg: RecomputeConfig):
    """``stmts`` with the last qualifying producer recomputed in its readers, or None."""
    for k in range(len(stmts) - 1, -1, -1):
        p = stmts[k]
        if not isinstance(p, Block) or not matches(p, cfg.producer_reqs):
            continue
        produced = _producer(p, parent, tmps, cfg)
        if produced is None:
            continue
        tref, value = produced
        readers = [j for j in range(len(stmts)) if j != k and _names(stmts[j], tref.source)]
        if not readers or readers[0] < k:
            continue
        elements = parent.ref(tref.source).shape.elements
        if not all(_reader_ok(stmts[j], tref, elements) for j in readers):
            continue
        inputs = {r.source for r in p.refs if r.dir is RefDir.IN}
        span = [s for s in stmts[k + 1 : readers[-1] + 1] if isinstance(s, Block)]
        if any(_writes_view(s, inputs) for s in span):
            continue
        out = list(stmts)
        for j in readers:
            out[j] = _inline(stmts[j], p, tref, value)
        del out[k]
        return out
    return None


def _names(s: Statement, source: str) -> bool:
    return isinstance(s, Block) and any(r.source == source for r in s.refs)


def _writes_view(block: Block, sources: set[str]) -> bool:
    """A write-direction refinement of one of ``sources`` (kept conservative: a written view)."""
    return any(r.source in sources and r.dir in (RefDir.OUT, RefDir.INOUT) for r in block.refs)


def _producer(p: Block, parent: Block, tmps: set[str], cfg: RecomputeConfig):
    """``(T's refinement, the stored scalar)`` when ``p`` is a producer the rule allows, else None."""
    if p.constraints or any(ix.affine is not None for ix in p.idxs):
        return None
    if not all(isinstance(s, _LEAF) for s in p.stmts):
        return None
    if sum(isinstance(s, Intrinsic) for s in p.stmts) > cfg.max_ops:
        return None
    outs = [r for r in p.refs if r.dir is not RefDir.IN]
    stores = [s for s in p.stmts if isinstance(s, Store)]
    if len(outs) != 1 or len(stores) != 1 or stores[0].into != outs[0].into:
        return None
    t = outs[0]
    if t.agg_op not in ("", "assign") or t.source not in tmps:
        return None
    if any(r.source == t.source for r in p.refs if r is not t):
        return None
    view = parent.ref(t.source)
    if any(not (a.is_constant and a.const == 0) for a in view.access) or view.dir is RefDir.IN:
        return None
    # T's access: one index per dim, coefficient 1, ranges = sizes, its strides the buffer's
    ranges = {ix.name: ix.range for ix in p.idxs}
    used = []
    for a, d, full in zip(t.access, t.shape.dims, view.shape.dims, strict=True):
        names = list(a.vars)
        if a.const != 0 or len(names) != 1 or a.coeff(names[0]) != 1 or ranges[names[0]] != full.size:
            return None
        if d.stride != full.stride:
            return None
        used.append(names[0])
    if sorted(used) != sorted(ranges) or t.shape.dtype is not view.shape.dtype:
        return None
    final = next((s for s in p.stmts if isinstance(s, Intrinsic) and s.outputs == (stores[0].from_,)), None)
    if final is None or final.dtype is not t.shape.dtype:
        return None
    # memory: at most one full-rate input, no larger than T's elements
    full_rate = [
        r for r in p.refs if r.dir is RefDir.IN and {v for a in r.access for v in a.vars} >= set(ranges)
    ]
    if len(full_rate) > 1 or any(r.shape.dtype.bits > t.shape.dtype.bits for r in full_rate):
        return None
    return t, stores[0].from_


def _reader_ok(b: Block, tref: Refinement, elements: int) -> bool:
    """A leaf reading ``T`` through plain loads of its dtype only, at most once per element on
    average."""
    if not all(isinstance(s, _LEAF) for s in b.stmts) or b.index_space > elements:
        return False
    if any(ix.affine is not None for ix in b.idxs):
        return False
    views = {r.into: r for r in b.refs if r.source == tref.source}
    if any(r.dir is not RefDir.IN or r.shape.dtype is not tref.shape.dtype for r in views.values()):
        return False
    return not any(isinstance(s, Store) and s.into in views for s in b.stmts)


def _inline(reader: Block, p: Block, tref: Refinement, value: str) -> Block:
    """``reader`` with each load of ``T`` replaced by ``p``'s statements at that access."""
    views = {r.into: r for r in reader.refs if r.source == tref.source}
    taken_refs = {r.into for r in reader.refs}
    taken_scalars = scalars_of(reader)
    index_of = [next(iter(a.vars)) for a in tref.access]
    refs = [r for r in reader.refs if r.into not in views]
    stmts: list[Statement] = []
    for s in reader.stmts:
        if not (isinstance(s, Load) and s.from_ in views):
            stmts.append(s)
            continue
        env = dict(zip(index_of, views[s.from_].access, strict=True))
        scalars = {value: s.into}
        for q in p.stmts:
            for name in _defines(q):
                if name not in scalars:
                    scalars[name] = fresh(f"{name}_{tref.source}", taken_scalars)
                    taken_scalars.add(scalars[name])
        renamed: dict[str, str] = {}
        for r in p.refs:
            if r is tref or r.dir is not RefDir.IN:
                continue
            access = tuple(a.substitute(env) for a in r.access)
            same = next(
                (o for o in refs if o.dir is RefDir.IN and o.source == r.source and o.access == access
                 and o.shape == r.shape),
                None,
            )
            if same is None:
                into = fresh(r.source, taken_refs)
                taken_refs.add(into)
                same = Refinement(RefDir.IN, into, access, r.shape, None if into == r.source else r.source,
                                  location=r.location)
                refs.append(same)
            renamed[r.into] = same.into
        for q in p.stmts:
            stmts.extend(_copy(q, scalars, renamed, env))
    at = next(k for k, r in enumerate(reader.refs) if r.into in views)  # the new views go there
    kept = [r for r in reader.refs if r.into not in views]
    added = refs[len(kept) :]
    refs = kept[:at] + added + kept[at:]
    tags = reader.tags | {t for t in p.tags if t.startswith("eltwise_")} if "eltwise" in reader.tags else None
    return replace(reader, refs=tuple(refs), stmts=tuple(stmts), tags=tags or reader.tags)


def _defines(s: Statement) -> tuple[str, ...]:
    if isinstance(s, Intrinsic):
        return s.outputs
    if isinstance(s, (Load, Constant, LoadIndex)):
        return (s.into,)
    return ()


def _copy(s: Statement, scalars: dict[str, str], refs: dict[str, str], env: dict[str, Affine]):
    """``s`` of the producer in the reader: scalars and refinements renamed, indexes substituted;
    the store of the value is dropped (its scalar is the reader's loaded one)."""
    if isinstance(s, Store):
        return []
    if isinstance(s, Load):
        return [Load(refs[s.from_], scalars[s.into])]
    if isinstance(s, Constant):
        return [replace(s, into=scalars[s.into])]
    if isinstance(s, LoadIndex):
        return [LoadIndex(s.affine.substitute(env), scalars[s.into])]
    assert isinstance(s, Intrinsic)
    return [replace(s, inputs=tuple(scalars[x] for x in s.inputs), outputs=(scalars[s.outputs[0]],))]
