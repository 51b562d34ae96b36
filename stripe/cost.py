"""The cost model: what a tiling of a leaf block costs in memory traffic, and what a whole program
is estimated to cost on a ``Hardware``.

* ``TileModel(block, hw, memory, parent_sizes)`` prices candidate tilings of one leaf block for
  ``autotile``. For tile sizes ``t`` (one per index, in the block's index order) it gives the
  **footprint** (bytes of every used refinement's tile, the outer view ``tiling.split`` makes:
  per dim ``Σ |coeff| (t - 1) + size``, clipped to the parent view, with the stride-1 dim
  rounded up to whole lines of ``line_bytes``), the **traffic** (per outer point each tile is
  loaded once, except that a tile not depending on the innermost outer indexes — the last ones
  of the index list with more than one tile, as ``split`` keeps the order — stays loaded across
  them; written refinements count twice, read and write), the **flops** (index points times
  ``ops_per_point``) and the **parallelism** (outer points over the indexes the written
  refinements use). Lower traffic per flop is better; ties go to more parallelism.
* ``estimate(program, hw) -> Report``: per ``#kernel`` block of ``#main``, flops, compute cycles
  (flops over the peak ops per cycle of the exec unit the block's location names, else of all
  units), bytes moved per memory level, and cycles ``max(compute, bytes / bandwidth)``; plus
  totals (kernels run one after another). Bytes: a kernel-level refinement counts against its
  location's memory, or the largest memory without one; a nested refinement counts only when it
  has a location (data brought into that memory there). A leaf block moves what its refinements
  touch over its whole index box once; a block with nested blocks moves, once per point, what its
  nested blocks reach through each refinement (their accesses over their index boxes, clipped to
  the view): a tiled block may keep a whole-buffer view (``gemm_tile``'s work-groups view all of
  A, B and C) while each point touches only its tile. Constraints are ignored: counts are over
  index boxes.

Both models are deliberately simple: they rank tilings and compare programs, they do not predict
times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stripe.hardware import Hardware
from stripe.ir import Block, Intrinsic, Refinement, Special, Store
from stripe.passes.rewrite import reads_writes

ACCUMULATING = frozenset({"add", "mul", "max", "min"})


def ops_per_point(block: Block) -> int:
    """Arithmetic operations one index point of ``block``'s own statements does: its intrinsics,
    plus one per store through an accumulating ``agg_op`` (a contraction's ``+``)."""
    aggs = {r.into for r in block.refs if r.agg_op in ACCUMULATING}
    n = 0
    for s in block.stmts:
        if isinstance(s, Intrinsic):
            n += 1
        elif isinstance(s, Store) and s.into in aggs:
            n += 1
    return n


def view_bytes(sizes: tuple[int, ...], strides: tuple[int, ...], elem: int, line: int) -> int:
    """Bytes of a view counted in whole lines: the last stride-1 dim is rounded up to ``line``
    bytes, every other dim multiplies the line count (no stride-1 dim: a line per element)."""
    contig = max((d for d, s in enumerate(strides) if s == 1), default=None)
    lines = 1
    for d, n in enumerate(sizes):
        lines *= -(-n * elem // line) if d == contig else n
    if contig is None:
        lines *= -(-elem // line)
    return lines * line


def _elem_bytes(r: Refinement) -> int:
    return r.shape.dtype.numpy.itemsize


# ------------------------------------------------------------------------------ tiling model
@dataclass(frozen=True)
class TileCost:
    tiles: tuple[int, ...]
    footprint: int  # bytes of one tile of every used refinement
    traffic: int  # bytes loaded (and stored) over the whole block
    flops: int
    parallel: int  # outer points over the output's indexes

    @property
    def bytes_per_flop(self) -> float:
        return self.traffic / max(1, self.flops)

    def key(self) -> tuple[int, int]:
        """Smaller is better: traffic (flops are the same for every tiling of a block), then
        parallelism."""
        return (self.traffic, -self.parallel)


@dataclass(frozen=True)
class _RefModel:
    dims: tuple[tuple[tuple[tuple[int, int], ...], int, int | None], ...]  # ((idx, |c|)...), size, clip
    strides: tuple[int, ...]
    elem: int
    deps: frozenset[int]  # positions of the indexes the access uses
    factor: int  # 2 written, 1 read


class TileModel:
    """Prices tilings of one leaf block (see the module docstring). ``parent_sizes`` gives, per
    refinement, the sizes of the view it refines (tiles are clipped to them, as ``split`` does)."""

    def __init__(
        self,
        block: Block,
        hw: Hardware,
        memory: str,
        parent_sizes: dict[str, tuple[int, ...]] | None = None,
    ):
        self.block = block
        self.names = tuple(i.name for i in block.idxs)
        self.ranges = tuple(i.range for i in block.idxs)
        self.line = hw.memory(memory).line_bytes
        self.capacity = hw.mem_bytes(memory)
        pos = {n: k for k, n in enumerate(self.names)}
        reads, writes = reads_writes(block)
        refs = []
        owned: set[int] = set()
        for r in block.refs:
            factor = 2 if r.into in writes else 1 if r.into in reads else 0
            if not factor:
                continue
            clip = (parent_sizes or {}).get(r.into)
            dims = []
            deps: set[int] = set()
            for d, a in enumerate(r.access):
                terms = tuple((pos[v], abs(int(a.coeff(v)))) for v in a.vars if a.coeff(v) != 0)
                deps.update(k for k, _ in terms)
                dims.append((terms, r.shape.dims[d].size, clip[d] if clip else None))
            if r.into in writes:
                owned |= deps
            refs.append(
                _RefModel(
                    tuple(dims),
                    tuple(x.stride for x in r.shape.dims),
                    _elem_bytes(r),
                    frozenset(deps),
                    factor,
                )
            )
        self.refs = tuple(refs)
        self.owned = frozenset(owned)
        self.flops = block.index_space * max(1, ops_per_point(block))

    def max_parallel(self) -> int:
        return math.prod(self.ranges[k] for k in self.owned)

    def evaluate(self, tiles: tuple[int, ...]) -> TileCost:
        outer = tuple(-(-r // t) for r, t in zip(self.ranges, tiles))
        points = math.prod(outer)
        footprint = traffic = 0
        for ref in self.refs:
            sizes = []
            for terms, size, clip in ref.dims:
                n = size + sum(c * (tiles[k] - 1) for k, c in terms)
                sizes.append(min(n, clip) if clip is not None else n)
            nbytes = view_bytes(tuple(sizes), ref.strides, ref.elem, self.line)
            footprint += nbytes
            reused = 1
            for k in range(len(outer) - 1, -1, -1):
                if outer[k] == 1:
                    continue
                if k in ref.deps:
                    break
                reused *= outer[k]
            traffic += ref.factor * nbytes * (points // reused)
        parallel = math.prod(outer[k] for k in self.owned)
        return TileCost(tiles, footprint, traffic, self.flops, parallel)

    def table(self, costs: list[TileCost], limit: int = 8) -> str:
        """The best ``limit`` candidates, ranked, as the seed's autotile table."""
        head = [*self.names, "footprint", "traffic", "bytes/flop", "parallel"]
        rows = [
            [
                *(str(t) for t in c.tiles),
                str(c.footprint),
                str(c.traffic),
                f"{c.bytes_per_flop:.4g}",
                str(c.parallel),
            ]
            for c in sorted(costs, key=TileCost.key)[:limit]
        ]
        return "\n".join("\t".join(r) for r in [head, *rows])


# ------------------------------------------------------------------------------ program estimate
@dataclass(frozen=True)
class KernelCost:
    name: str
    flops: int
    compute_cycles: float
    bytes: dict[str, int] = field(default_factory=dict)  # per memory level
    memory_cycles: float = 0.0
    cycles: float = 0.0


@dataclass(frozen=True)
class Report:
    clock_mhz: float
    kernels: tuple[KernelCost, ...]

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def cycles(self) -> float:
        return sum(k.cycles for k in self.kernels)

    @property
    def bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.kernels:
            for m, n in k.bytes.items():
                out[m] = out.get(m, 0) + n
        return out

    def format(self) -> str:
        mems = sorted(self.bytes)
        head = ["kernel", "flops", "compute", *(f"bytes {m}" for m in mems), "memory", "cycles"]
        rows = [
            [
                k.name,
                str(k.flops),
                f"{k.compute_cycles:.0f}",
                *(str(k.bytes.get(m, 0)) for m in mems),
                f"{k.memory_cycles:.0f}",
                f"{k.cycles:.0f}",
            ]
            for k in self.kernels
        ]
        total = self.bytes
        rows.append(
            [
                "total",
                str(self.flops),
                f"{sum(k.compute_cycles for k in self.kernels):.0f}",
                *(str(total[m]) for m in mems),
                f"{sum(k.memory_cycles for k in self.kernels):.0f}",
                f"{self.cycles:.0f}",
            ]
        )
        widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
        lines = [
            "  ".join(x.rjust(w) if c else x.ljust(w) for c, (x, w) in enumerate(zip(r, widths)))
            for r in [head, *rows]
        ]
        us = self.cycles / self.clock_mhz if self.clock_mhz else 0.0
        lines.append(f"estimated {self.cycles:.0f} cycles = {us:.3g} us at {self.clock_mhz:g} MHz")
        return "\n".join(lines)


def estimate(program: Block, hw: Hardware) -> Report:
    """The cost report of a ``#program`` on ``hw`` (see the module docstring)."""
    main = next((s for s in program.stmts if isinstance(s, Block) and "main" in s.tags), None)
    kernels = [] if main is None else [s for s in main.stmts if isinstance(s, Block)]
    largest = max(hw.mem_units, key=lambda m: hw.mem_units[m].size_KiB * hw.mem_units[m].count)
    return Report(hw.clock_mhz, tuple(_kernel_cost(k, hw, largest) for k in kernels))


def _kernel_cost(kernel: Block, hw: Hardware, largest: str) -> KernelCost:
    flops = 0
    moved: dict[str, int] = {}

    def visit(b: Block, mult: int, top: bool) -> None:
        nonlocal flops
        nested = [s for s in b.stmts if isinstance(s, Block)]
        flops += mult * b.index_space * ops_per_point(b)
        reads, writes = reads_writes(b)
        for r in b.refs:
            mem = r.location.name if r.location is not None else (largest if top else None)
            if mem is None or mem not in hw.mem_units:
                continue
            factor = _touch_factor(b, r.into, reads, writes)
            if not factor:
                continue
            line = hw.memory(mem).line_bytes
            if nested:
                n = b.index_space * view_bytes(_reached(b, r), _strides(r), _elem_bytes(r), line)
            else:
                n = view_bytes(_touched_sizes(b, r), _strides(r), _elem_bytes(r), line)
            moved[mem] = moved.get(mem, 0) + mult * factor * n
        for s in nested:
            visit(s, mult * b.index_space, False)

    visit(kernel, 1, True)
    unit = kernel.location.name if kernel.location is not None else None
    if unit in hw.exec_units:
        peak = hw.exec_units[unit].count * hw.exec_units[unit].ops_per_cycle
    else:
        peak = hw.peak_ops_per_cycle()
    compute = flops / max(1, peak)
    memory = 0.0
    for mem, n in moved.items():
        bw = _bandwidth(hw, mem)
        if bw:
            memory = max(memory, n / bw)
    return KernelCost(kernel.name, flops, compute, moved, memory, max(compute, memory))


def _touch_factor(b: Block, name: str, reads: set[str], writes: set[str]) -> int:
    """How many times a refinement's data crosses the bus: twice when a store writes it (read and
    write back), once when it is only read or only a special's output."""
    special_out = {o for s in b.stmts if isinstance(s, Special) for o in s.outputs}
    if name in writes:
        return 1 if name in special_out and name not in reads else 2
    return 1 if name in reads else 0


def _strides(r: Refinement) -> tuple[int, ...]:
    return tuple(d.stride for d in r.shape.dims)


def _touched_sizes(b: Block, r: Refinement) -> tuple[int, ...]:
    """Per dim, how many elements the refinement's accesses span over the block's index box."""
    ranges = {i.name: i.range for i in b.idxs}
    out = []
    for d, a in enumerate(r.access):
        span = sum(abs(int(a.coeff(v))) * (ranges.get(v, 1) - 1) for v in a.vars)
        out.append(span + r.shape.dims[d].size)
    return tuple(out)


def _reached(b: Block, r: Refinement) -> tuple[int, ...]:
    """Per dim, how many elements of ``r``'s view one point of ``b`` touches: the whole view where
    ``b``'s own statements name it, else the span its nested blocks reach through it (each
    child's access over its index box, plus what one point of the child reaches), clipped to the
    view."""
    sizes = r.shape.sizes
    own = (s for s in b.stmts if not isinstance(s, Block))
    if any(r.into in (*getattr(s, "inputs", ()), *getattr(s, "outputs", ()), getattr(s, "from_", None),
                      getattr(s, "into", None)) for s in own):
        return sizes
    lo: list[int | None] = [None] * len(sizes)
    hi: list[int | None] = [None] * len(sizes)
    for child in (s for s in b.stmts if isinstance(s, Block)):
        ranges = {i.name: i.range for i in child.idxs}
        for cr in child.refs:
            if cr.source != r.into or len(cr.access) != len(sizes):
                continue
            inner = _reached(child, cr) if any(isinstance(s, Block) for s in child.stmts) else cr.shape.sizes
            for d, a in enumerate(cr.access):
                coeffs = [(int(a.coeff(v)), ranges.get(v, 1) - 1) for v in a.vars]
                low = int(a.const) + sum(min(c, 0) * n for c, n in coeffs)
                high = int(a.const) + sum(max(c, 0) * n for c, n in coeffs) + inner[d]
                lo[d] = low if lo[d] is None else min(lo[d], low)
                hi[d] = high if hi[d] is None else max(hi[d], high)
    if any(x is None for x in lo):
        return sizes  # no child reaches it (or not in every dim): the view, as before
    return tuple(min(n, max(0, top - max(0, low))) for n, low, top in zip(sizes, lo, hi))  # type: ignore[operator]


def _bandwidth(hw: Hardware, mem: str) -> float | None:
    """Bytes per cycle into or out of memory ``mem``: the fastest bus naming it."""
    best = None
    for bus in hw.buses:
        if any(s.split("[", 1)[0] == mem for s in (*bus.sources, *bus.sinks)):
            best = bus.bytes_per_cycle if best is None else max(best, bus.bytes_per_cycle)
    return best
