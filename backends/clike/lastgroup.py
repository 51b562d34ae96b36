"""A global reduction as one kernel: work-groups of partials, and the last group to finish combines.

The block (``stripe.passes.one_kernel``: a ``CombinePlan`` with a ``counter``) is a partial block
``K0``, whose lanes each assign their partial to the ``#tmp`` buffer ``P``, nested before the
combine ``O = agg over lanes of P``. On a GPU each kernel launch costs more than such a combine
(figures: bench/RESULTS.md, "Figures moved from docstrings"),
so here both run in one launch, the classic *threadfence reduction*:

* work-item ``gid`` computes lane ``gid``'s partial as ``K0`` does (its statements through the
  general emitter; the lane's element of ``P`` is a register), in work-groups of ``W`` (a power of
  two, at most ``groupreduce.MAX_GROUP`` and the lanes), so lane ``l`` reads what it reads in
  ``K0`` (adjacent work-items, adjacent elements);
* the group's ``W`` partials meet in a tree in ``__local`` memory (``groupreduce.tree``), and
  work-item 0 writes the group's value to ``P[group]`` through a ``volatile`` pointer, makes it
  visible with ``mem_fence(CLK_GLOBAL_MEM_FENCE)``, then ``atomic_inc``s the counter; the group
  that gets ``groups - 1`` is the last: every other group's value is in ``P``;
* the last group resets the counter to 0 (``atomic_xchg``: the next launch finds it so, and the
  runner zeroes a ``counter`` buffer only when it allocates it), reads the ``G`` group values
  through ``volatile`` pointers (no stale cached copy under OpenCL 1.2's memory model), each
  work-item ``w`` aggregating values ``w, w + W, ...``, then a tree, and work-item 0 writes ``O``
  as ``groupreduce.result`` does (assigned, or aggregated into ``O``'s start, then the masks).

One group (``lanes <= W``) needs neither ``P`` nor the counter: its tree is the result. No group
waits for another (the last one only finds that the others are done), so the pattern needs no
co-residency of groups, only that the device completes work-groups independently, as GPU OpenCL
drivers (and PoCL) do. The combine is regrouped (groups of ``W`` adjacent lanes, then the groups):
a reassociation of the aggregation ``split_reduction`` declares; integer sums, max and min are
exact in any order. ``takes`` keeps the target's refusals (``groupreduce.takes``: plain register
types, the kernel's buffers); a refused block runs in the general kernel (one work-item: correct,
slow), which a block the pass made is not (it refuses the same types).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from backends.clike import groupreduce
from backends.clike.groupreduce import Combine, decode, result, tree
from backends.clike.kernel import KernelEmitter
from backends.clike.ops import binary
from backends.clike.views import View
from stripe.ir import Block, RefDir
from stripe.plans import CombinePlan


@dataclass(frozen=True)
class OneKernel:
    """A matched one-kernel reduction: the partial block, the combine (``groupreduce``'s view of
    the rest of the block) and the counter's refinement name."""

    partial: Block
    combine: Combine
    counter: str

    @property
    def lanes(self) -> int:
        return self.combine.lane_count

    @property
    def group(self) -> int:
        return self.combine.group


def takes(em: KernelEmitter) -> OneKernel | None:
    """The kernel's one-kernel reduction when this target runs it so: it has work-groups and
    ``groupreduce`` takes its combine (any lane count); else None."""
    b, plan = em.block, em.block.plan
    if not em.t.workgroups or not isinstance(plan, CombinePlan) or not plan.counter:
        return None
    rest = replace(b, stmts=b.stmts[1:], plan=replace(plan, counter=""))
    c = groupreduce.takes(rest, tuple(em.info.buffers), em.t, min_lanes=1)
    if c is None or plan.counter not in em.ptrs:
        return None
    return OneKernel(b.stmts[0], c, plan.counter)


def emit(em: KernelEmitter, one: OneKernel) -> tuple[str, int, int]:
    """The kernel text, its work-items and its work-group size."""
    t, c = em.t, one.combine
    T, W, L = t.reg(c.dtype), one.group, one.lanes
    G = -(-L // W)
    for name in ("lid", "grp", "gid", "s", "red", "last", "acc", "l", "a", "b", "cur", "got"):
        em.names.add(name)  # the fixed names of the lines below and of groupreduce's
    em.depth = 1
    em.line(f"__local {T} red[{W}];")
    if G > 1:
        em.line("__local int last;")
    em.line("const long lid = (long)get_local_id(0);")
    em.line("const long grp = (long)get_group_id(0);")
    em.line("const long gid = (long)get_global_id(0);")
    part = em.fresh("part")
    em.line(f"{T} {part}[1] = {{{t.literal(0, c.dtype)}}};")
    with em.scope(f"if (gid < {L})"):
        _partial(em, one, part)
    em.line(f"red[lid] = {part}[0];")
    em.line("barrier(CLK_LOCAL_MEM_FENCE);")
    lines = tree(t, c, W, f"{L} - grp * {W}" if L % W else None)  # a short last group: its lanes
    if G == 1:
        lines += result(t, c, em.ptrs, {}, "red[0]")
    else:
        lines += _last(t, one, em.ptrs, T, W, G, L)
    body = [ln[4:] for ln in em.lines] + lines
    plain = frozenset({em.ptrs[c.src.source], em.ptrs[one.counter]})  # read as volatile: no restrict
    return t.group_kernel(em.symbol, em.params, W, ["    " + ln for ln in body], plain), G * W, W


def _partial(em: KernelEmitter, one: OneKernel, part: str) -> None:
    """Lane ``gid``'s partial into the register array ``part``: ``K0``'s point, its view of ``P`` a
    register (the lanes decode from ``gid`` in ``P``'s dimension order: lane ``l`` is element
    ``l``)."""
    b, k0, c = em.block, one.partial, one.combine
    src = c.src.source
    ranges = {ix.name: ix for ix in k0.idxs}
    mine = next(r for r in k0.refs if r.source == src)
    order = tuple(ranges[a.terms[0][0]] for a in mine.access)
    lines: list[str] = []
    vals = decode(lines, "gid", order, "lane_")
    for ln in lines:
        em.line(ln)
    em.names.update(vals.values())
    parents: dict[str, View] = {}
    for r in b.refs:
        if r.into == one.counter or (r.dir is RefDir.NONE and r.from_ is None):
            continue
        if r.source == src:
            dims = tuple(replace(d, stride=0) for d in r.shape.dims)
            parents[r.into] = View(r.into, part, c.dtype, "0", dims, c.dtype, r.agg_op, True)
        else:
            parents[r.into] = em.view(b, r, {}, None)
    em.point(k0, vals, parents)


def _last(t, one: OneKernel, ptrs: dict[str, str], T: str, W: int, G: int, L: int) -> list[str]:
    """Work-item 0 publishes the group's value and counts; the last group combines the ``G``."""
    c = one.combine
    p = ptrs[c.src.source]
    count = ptrs[one.counter]  # the pass names the counter's refinement as its buffer
    vp = f"((volatile __global {T}*){p})"
    lines = [
        "if (lid == 0) {",
        f"    {vp}[grp] = red[0];",
        "    mem_fence(CLK_GLOBAL_MEM_FENCE);  /* the value is visible before the count */",
        f"    last = atomic_inc({count}) == {G - 1};",
        f"    if (last) atomic_xchg({count}, 0);  /* every group has counted: zero for the next launch */",
        "}",
        "barrier(CLK_LOCAL_MEM_FENCE);",
        "if (last) {",
        "    mem_fence(CLK_GLOBAL_MEM_FENCE);",
        f"    {T} acc = {vp}[lid < {G} ? lid : 0];",
        f"    for (long l = lid + {W}; l < {G}; l += {W}) {{",
        f"        const {T} x = {vp}[l];",
        f"        acc = {binary(t, c.dst.agg_op, 'acc', 'x', c.dtype)};",
        "    }",
        "    red[lid] = acc;",
        "    barrier(CLK_LOCAL_MEM_FENCE);",
    ]
    n = min(G, W)
    width = 1 << (n - 1).bit_length()  # the tree of the first n values: no empty steps
    inner = tree(t, c, width, n) + result(t, c, ptrs, {}, "red[0]")
    return lines + ["    " + ln for ln in inner] + ["}"]


__all__ = ["OneKernel", "emit", "takes"]

