"""``schedule``: run a block's sub-blocks on data staged in a small memory, with swap-in and
swap-out transfer blocks, keeping what the next sub-blocks reuse resident while it fits.

The staging primitive (regions, transfer blocks, restaging a consumer) is ``stripe.passes.cache``'s;
this module decides which regions are resident when, the way PlaidML's SchedulePass does: walk the
sub-blocks in order, load what each needs, evict the resident region used farthest in the future
(Belady) when the memory is full, and write back what was written before anything else reads the
buffer and at the end.
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
    Location,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
    walk,
)
from stripe.passes.cache import (
    Box,
    Region,
    Transfer,
    aliased,
    allocation,
    boxes,
    chain_of,
    footprint,
    restaged,
    transfer,
)
from stripe.passes.locate import LocSpec
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, fresh, reads_writes, rewrite, stmt_refs
from tile.affine import Affine


@dataclass(frozen=True)
class ScheduleConfig:
    reqs: tuple[str, ...]
    mem_loc: LocSpec
    mem_KiB: float  # the size of one bank of mem_loc
    xfer_loc: LocSpec
    alignment: int = 1  # bytes: each staged region's size is rounded up to it
    num_banks: int | None = None  # banks of mem_KiB each; staged regions get location units [bank]
    allow_out_of_range_accesses: bool = True  # the seed's flag; regions are always clipped to the buffer


@dataclass
class _Resident:
    region: Region
    name: str  # the allocation's name in the scheduled block
    bytes: int
    bank: int
    dirty: bool = False


@dataclass(frozen=True)
class _Need:
    """What one statement of the scheduled block touches: regions to stage (by parent ref) and the
    parent refs it reads and writes. ``why`` says why it is left unstaged (empty: staged)."""

    regions: dict[str, Region]
    reads: frozenset[str]
    writes: frozenset[str]
    why: str = ""
    overwritten: frozenset[str] = frozenset()  # regions the block overwrites whole, unread


@register("schedule", ScheduleConfig)
def schedule(program: Block, cfg: ScheduleConfig, hw: Hardware) -> Block:
    """Matches blocks S with every tag in ``reqs`` (``main``, or a tile loop). For each statement
    block K of S in order, the region of each of S's buffers that K (and what it nests) can touch
    is staged into a dense allocation in ``mem_loc``: a ``#xfer #swap_in`` block (location
    ``xfer_loc``) copies it in, K refines the allocation instead (accesses shifted, strides dense),
    and a region K wrote is copied back by a ``#xfer #swap_out`` block before anything else uses
    that buffer unstaged, before another region of it is staged, when evicted, and at the end of S.
    A region stays resident for the next sub-blocks that need exactly that region while all
    resident regions (sizes rounded up to ``alignment``) fit ``num_banks`` banks of ``mem_KiB``
    (with ``num_banks`` each allocation's location gets its bank as unit); when one does not fit,
    the resident region used farthest in the future is evicted. A region is clipped to its buffer
    where S views the buffer at a fixed place (``main``); in a tile loop the transfers are
    constrained to the buffer instead. No swap-in for a region K overwrites whole without reading
    it; no swap-out for a program temporary that nothing later uses.

    A sub-block is left unstaged (with a comment saying why) when its own regions do not fit, when
    it already allocates in ``mem_loc`` (``cache`` staged its tiles), or when a buffer it uses
    cannot be staged (a view with other strides than its buffer, a buffer seen through two
    refinements, a view above S that moves with an enclosing block's indexes). When S is ``main``
    the allocations are program buffers tagged ``tmp`` (in ``mem_loc``, refined ``inout`` by main)
    and the transfer blocks are tagged ``kernel`` too, so every statement of main stays a kernel
    that a backend runs on its own; elsewhere they are allocations of S.

    In a block S with several index points (a tile loop) only what a sub-block reads is staged:
    points may run in parallel, and a written-back copy would undo another point's writes.
    ``allow_out_of_range_accesses`` is accepted for the seed's configs and changes nothing.

    Guarantees: every sub-block reads and writes the same values in the same order (a staged
    region holds the buffer's current elements, writes land there and are copied back before any
    other reader), so the meaning is exact, floats included."""
    cap = int(cfg.mem_KiB * 1024)
    banks = cfg.num_banks or 1
    new_roots: list[Refinement] = []

    def fn(s_block: Block, ctx: Context) -> Block | None:
        at_main = "main" in s_block.tags and len(ctx.parents) == 1
        bxs = boxes(ctx, s_block)
        if bxs is None:
            return None
        sched = _Scheduler(cfg, ctx, s_block, bxs[-1], cap, banks, at_main)
        out = sched.run()
        if out is None:
            return None
        new_roots.extend(sched.roots)
        return out

    out = rewrite(program, fn, cfg.reqs)
    if new_roots:
        out = replace(out, refs=out.refs + tuple(new_roots))
    return out


class _Scheduler:
    def __init__(self, cfg, ctx: Context, block: Block, box: Box, cap: int, banks: int, at_main: bool):
        self.cfg, self.ctx, self.block, self.box = cfg, ctx, block, box
        self.cap, self.banks, self.at_main = cap, banks, at_main
        self.taken = {r.into for r in block.refs} | {r.into for p in ctx.parents for r in p.refs}
        self.resident: dict[str, _Resident] = {}
        self.out: list[Statement] = []
        self.refs: list[Refinement] = []
        self.roots: list[Refinement] = []
        self.staged_any = False
        self.needs = [self.need(s) for s in block.stmts]

    # -------------------------------------------------------------------- analysis
    def need(self, s: Statement) -> _Need:
        if not isinstance(s, Block):
            reads, writes = stmt_refs(s)
            return _Need({}, reads, writes, "not a block")
        mine = {r.into for r in self.block.refs if not self._own(r)}
        r_names, w_names = reads_writes(s)
        src = {v.into: v.source for v in s.refs}
        reads = frozenset(src[n] for n in r_names if src.get(n) in mine)
        writes = frozenset(src[n] for n in w_names if src.get(n) in mine)
        regions: dict[str, Region] = {}
        why = ""
        for p in sorted({v.source for v in s.refs if v.source in mine}):
            reg = self.region(s, p)
            if isinstance(reg, str):
                why = why or reg
            elif reg is not None:
                regions[p] = reg
        if not why and _stages_itself(s, self.cfg.mem_loc.name):
            why = f"it stages its own data in {self.cfg.mem_loc.name}"
        if self.block.index_space > 1:
            # another point of the block may write the same elements at the same time, and a
            # copy written back whole would undo its writes: written buffers stay unstaged
            regions = {p: r for p, r in regions.items() if p not in writes}
        if not why and regions:
            total = [self.nbytes(r) for r in regions.values()]
            if not self.fits_empty(total):
                why = f"its footprint of {sum(total)} bytes does not fit {self.cfg.mem_KiB} KiB"
        fresh_writes = frozenset(p for p in regions if _overwrites(s, p, regions[p], reads))
        return _Need(regions, reads, writes, why, fresh_writes)

    def _own(self, r: Refinement) -> bool:
        parent = self.ctx.parent
        return (
            r.dir is RefDir.NONE
            and r.from_ is None
            and (parent is None or all(q.into != r.into for q in parent.refs))
        )

    def region(self, s: Block, p: str) -> Region | str | None:
        """The region of ``p`` that ``s`` may touch, clipped to the buffer where ``p`` is a fixed
        view of it; None if none; a reason if it cannot be told. Where ``p`` moves with the
        scheduled block's indexes (a tile), the region is not clipped: its transfers are
        constrained to the buffer instead."""
        ref = self.block.ref(p)
        chain = chain_of(self.ctx, self.block, p)
        if chain is None or chain.fixed is None:
            return f"{p} is not a view of its buffer at a fixed place"
        if aliased(self.ctx, self.block, p):
            return f"{p}'s buffer has another view"
        base = [int(a.const) + f for a, f in zip(ref.access, chain.fixed, strict=True)]
        spans = None
        strides = tuple(d.stride for d in ref.shape.dims)
        views = [v for v in s.refs if v.source == p]
        for v in views:
            if tuple(d.stride for d in v.shape.dims) != strides:
                return f"a view of {p} has other strides"
            fp = footprint(s, v.into, self.box)
            if fp is None:
                return f"what {s.name or 'the block'} touches of {p} is unknown"
            if fp:
                spans = (
                    fp
                    if spans is None
                    else [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(spans, fp, strict=True)]
                )
        if spans is None:
            return None
        if not all(a.is_constant for a in ref.access):
            return Region(p, tuple(lo for lo, _ in spans), tuple(hi - lo + 1 for lo, hi in spans))
        origin, sizes = [], []
        for (lo, hi), b, n in zip(spans, base, chain.sizes, strict=True):
            lo, hi = max(lo + b, 0), min(hi + b, n - 1)
            if hi < lo:
                return None
            origin.append(lo - b)
            sizes.append(hi - lo + 1)
        if any(d.size > n for v in views for d, n in zip(v.shape.dims, sizes, strict=True)):
            return f"a view of {p} is larger than the buffer"
        return Region(p, tuple(origin), tuple(sizes))

    def nbytes(self, region: Region) -> int:
        size = region.elements * self.block.ref(region.ref).shape.dtype.numpy.itemsize
        a = max(1, self.cfg.alignment)
        return -(-size // a) * a

    # -------------------------------------------------------------------- placement in banks
    def free(self, bank: int) -> int:
        return self.cap - sum(r.bytes for r in self.resident.values() if r.bank == bank)

    def bank_for(self, size: int) -> int | None:
        best = max(range(self.banks), key=lambda b: (self.free(b), -b))
        return best if self.free(best) >= size else None

    def fits_empty(self, sizes: list[int]) -> bool:
        room = [self.cap] * self.banks
        for size in sorted(sizes, reverse=True):
            k = max(range(self.banks), key=lambda b: room[b])
            if room[k] < size:
                return False
            room[k] -= size
        return True

    def next_use(self, p: str, region: Region, after: int) -> float:
        for j in range(after + 1, len(self.needs)):
            n = self.needs[j]
            if p in n.regions or p in n.reads or p in n.writes:
                return j if n.regions.get(p) == region and not n.why else float("inf")
        return float("inf")

    # -------------------------------------------------------------------- emitting
    def location(self, bank: int) -> Location:
        if self.cfg.num_banks is None:
            return self.cfg.mem_loc.location()
        return Location(self.cfg.mem_loc.name, (Affine.constant(bank),))

    def xfer(self, res: _Resident, *, out: bool) -> None:
        chain = chain_of(self.ctx, self.block, res.region.ref)
        tags = {"xfer", "swap_out" if out else "swap_in"} | ({"kernel"} if self.at_main else set())
        name = f"{'swap_out' if out else 'swap_in'} {res.name}"
        dress = Transfer(frozenset(tags), self.cfg.xfer_loc.location(), name)
        x = transfer(
            self.block, self.box, chain, res.region, res.name, copy_out=out, agg="assign", dress=dress
        )
        assert x is not None, "chain.fixed gives every position above the scheduled block"
        self.out.append(x)

    def dead(self, p: str, k: int) -> bool:
        """Whether ``p``'s contents no longer matter from statement ``k`` on: a temporary program
        buffer (not an output) that no statement from ``k`` on touches."""
        if not self.at_main or "output" in self.ctx.ref_chain(self.block, p)[-1].tags:
            return False
        return not any(p in n.regions or p in n.reads or p in n.writes for n in self.needs[k:])

    def evict(self, p: str, k: int) -> None:
        res = self.resident.pop(p)
        if res.dirty and not self.dead(p, k):
            self.xfer(res, out=True)

    def load(self, region: Region, bank: int, overwritten: frozenset[str]) -> _Resident:
        p = region.ref
        name = fresh(f"{p}_s", self.taken)
        self.taken.add(name)
        dtype = self.block.ref(p).shape.dtype
        alloc = allocation(name, region, dtype, self.location(bank))
        if self.at_main:
            self.roots.append(replace(alloc, tags=frozenset({"tmp"})))
            self.refs.append(replace(alloc, dir=RefDir.INOUT))
        else:
            self.refs.append(alloc)
        res = _Resident(region, name, self.nbytes(region), bank)
        self.resident[p] = res
        if p not in overwritten:
            self.xfer(res, out=False)
        return res

    def run(self) -> Block | None:
        for k, s in enumerate(self.block.stmts):
            need = self.needs[k]
            if need.why or not need.regions:
                self.unstaged(s, need, need.why)
            else:
                self.staged(k, s, need)
        for p in sorted(self.resident):
            self.evict(p, len(self.needs))
        if not self.staged_any:
            return None
        return replace(self.block, refs=self.block.refs + tuple(self.refs), stmts=tuple(self.out))

    def sync(self, p: str, writes: bool) -> None:
        """Before ``p``'s buffer is used unstaged: write back its resident region if dirty, and
        forget it if the use writes the buffer (the copy would go stale)."""
        res = self.resident.get(p)
        if res is None:
            return
        if res.dirty:
            self.xfer(res, out=True)
            res.dirty = False
        if writes:
            del self.resident[p]

    def unstaged(self, s: Statement, need: _Need, why: str) -> None:
        for p in sorted(need.reads | need.writes | set(need.regions)):
            self.sync(p, p in need.writes)
        if why and isinstance(s, Block):
            s = replace(s, comments=(*s.comments, f"schedule: not staged: {why}"))
        self.out.append(s)

    def staged(self, k: int, s: Block, need: _Need) -> None:
        for p, region in need.regions.items():
            if p in self.resident and self.resident[p].region != region:
                self.evict(p, k)
        # a buffer used but with no region to stage (nothing of it inside the buffer) is unstaged
        for p in sorted((need.reads | need.writes) - set(need.regions)):
            self.sync(p, p in need.writes)
        todo = sorted(
            (r for p, r in need.regions.items() if p not in self.resident),
            key=lambda r: (-self.nbytes(r), r.ref),
        )
        for region in todo:
            bank = self.bank_for(self.nbytes(region))
            while bank is None:
                others = [p for p in self.resident if p not in need.regions]
                if not others:
                    break
                victim = max(others, key=lambda p: (self.next_use(p, self.resident[p].region, k), p))
                self.evict(victim, k)
                bank = self.bank_for(self.nbytes(region))
            if bank is None:  # fragmented banks: start over from empty ones (fits_empty said so)
                for p in sorted(self.resident):
                    self.evict(p, k)
                todo = sorted(need.regions.values(), key=lambda r: (-self.nbytes(r), r.ref))
                for again in todo:
                    self.load(again, self.bank_for(self.nbytes(again)), need.overwritten)
                break
            self.load(region, bank, need.overwritten)
        for p in need.regions:
            res = self.resident[p]
            s = restaged(s, p, res.name, need.regions[p], self.location(res.bank))
            if p in need.writes:
                self.resident[p].dirty = True
        self.out.append(s)
        self.staged_any = True


def _stages_itself(block: Block, memory: str) -> bool:
    """Whether ``block`` or a block inside it allocates in ``memory`` (``cache`` staged its tiles)."""
    return any(
        r.dir is RefDir.NONE and r.from_ is None and r.location is not None and r.location.name == memory
        for b in walk(block)
        for r in b.refs
    )


def _overwrites(s: Block, p: str, region: Region, reads: frozenset[str]) -> bool:
    """Whether ``s`` overwrites every element of ``region`` and reads none (so it needs no
    swap-in): a block of specials whose output view is the region (specials write every element
    of their outputs), or an unconstrained elementwise block storing with ``assign`` through a view
    whose access is ``origin + one index of the region's size`` per dim, a different index each."""
    views = [v for v in s.refs if v.source == p]
    if p in reads or len(views) != 1:
        return False
    v = views[0]
    if all(isinstance(t, Special) for t in s.stmts):
        return (
            any(v.into in t.outputs for t in s.stmts)
            and all(a.is_constant for a in v.access)
            and tuple(int(a.const) for a in v.access) == region.origin
            and v.shape.sizes == region.sizes
        )
    scalar = (Load, Store, LoadIndex, Constant, Intrinsic)
    if s.constraints or v.agg_op not in ("", "assign") or not all(isinstance(t, scalar) for t in s.stmts):
        return False
    if not any(isinstance(t, Store) and t.into == v.into for t in s.stmts):
        return False
    ranges = {i.name: i.range for i in s.idxs if i.affine is None}
    used = []
    for a, origin, size in zip(v.access, region.origin, region.sizes, strict=True):
        terms = list(a.terms)
        if len(terms) != 1 or terms[0][1] != 1 or a.const != origin or ranges.get(terms[0][0]) != size:
            return False
        used.append(terms[0][0])
    return len(set(used)) == len(used)
