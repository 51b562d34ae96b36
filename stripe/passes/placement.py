"""``memory_placement``: give allocations byte offsets in the arena of their memory, so that two
allocations alive at the same time never overlap (PlaidML's MemoryPlacementPass, placer.cc).

Lifetimes come from a timeline of the block tree: each block runs over an interval of ticks, its
nested blocks over disjoint sub-intervals in statement order. An allocation local to a block lives
over that block's interval (so the locals of sibling blocks may share space, a block's locals and
its descendants' may not); a root buffer lives from the first to the last kernel of ``main`` that
uses it, inputs from the start, outputs to the end. Offsets are given largest allocation first,
each at the lowest ``alignment`` multiple that overlaps none of the allocations already placed
whose lifetimes meet its own. ``check_placement`` checks a program's offsets the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, Refinement
from stripe.passes.locate import LocSpec
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, is_allocation, rewrite

Path = tuple[int, ...]  # statement numbers from the selected block down to a block


@dataclass(frozen=True)
class PlacementConfig:
    reqs: tuple[str, ...]
    locs: tuple[LocSpec, ...]  # memories to place (by name); a root buffer with no location is DRAM
    alignment: int = 1  # bytes


@dataclass(frozen=True)
class Alloc:
    path: Path  # the block declaring it
    name: str
    memory: str  # the location name (its arena)
    bytes: int
    live: tuple[int, int]  # inclusive ticks

    def where(self) -> str:
        return self.name if not self.path else f"{self.name} (in block {'/'.join(map(str, self.path))})"


@register("memory_placement", PlacementConfig)
def memory_placement(program: Block, cfg: PlacementConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` (``program``). Gives an ``offset`` to each
    allocation in the block's tree located in one of ``locs``: the root buffers (when the block is
    the root; one with no location counts as ``DRAM``) and the local allocations (dir none, no
    ``from_``, naming nothing of the parent) whose location has one of those names. Offsets are
    multiples of ``alignment``, per memory (the location's name; units are not told apart).

    Guarantees: two allocations of one memory whose lifetimes meet (module docstring) never
    share a byte; nothing else changes, so the meaning is the same (executors ignore offsets).
    Offsets are per point of a block: a backend running a block's points in parallel gives each
    its own copy of the block's locals, as PlaidML's placer assumed."""
    names = {loc.name for loc in cfg.locs}

    def fn(b: Block, ctx: Context) -> Block:
        allocs = [a for a in allocations(b, not ctx.parents, ctx.parent) if a.memory in names]
        return with_offsets(b, place(allocs, max(1, cfg.alignment)))

    return rewrite(program, fn, cfg.reqs)


def place(allocs: list[Alloc], alignment: int) -> dict[tuple[Path, str], int]:
    """Largest first, the lowest aligned offset clear of every placed allocation that is alive
    at the same time in the same memory."""
    placed: list[tuple[Alloc, int]] = []
    out: dict[tuple[Path, str], int] = {}
    for a in sorted(allocs, key=lambda a: (-a.bytes, a.live, a.path, a.name)):
        rivals = [(o, off) for o, off in placed if o.memory == a.memory and _meet(o.live, a.live)]
        candidates = sorted({0} | {_align(off + o.bytes, alignment) for o, off in rivals})
        for c in candidates:
            if all(c + a.bytes <= off or off + o.bytes <= c for o, off in rivals if o.bytes and a.bytes):
                break
        placed.append((a, c))
        out[(a.path, a.name)] = c
    return out


def check_placement(program: Block) -> None:
    """Raise ``AssertionError`` naming two allocations of one memory that are alive at the same
    time and whose placed byte ranges overlap (only allocations with an ``offset`` count)."""
    allocs = allocations(program, True)
    offsets = _offsets(program, ())
    placed = [(a, offsets[(a.path, a.name)]) for a in allocs if offsets.get((a.path, a.name)) is not None]
    for i, (a, x) in enumerate(placed):
        for b, y in placed[i + 1 :]:
            if a.memory != b.memory or not _meet(a.live, b.live) or not a.bytes or not b.bytes:
                continue
            if x < y + b.bytes and y < x + a.bytes:
                raise AssertionError(
                    f"{a.where()} at [{x}, {x + a.bytes}) and {b.where()} at [{y}, {y + b.bytes}) "
                    f"overlap in {a.memory} while both are alive"
                )


# ------------------------------------------------------------------------------ lifetimes
def allocations(block: Block, root: bool, parent: Block | None = None) -> list[Alloc]:
    """Every allocation of ``block``'s tree with its memory, size and lifetime; with ``root``,
    ``block`` is the program and its refinements are the buffers (else ``parent`` encloses it)."""
    spans: dict[Path, tuple[int, int]] = {}
    _timeline(block, (), spans, [0])
    out: list[Alloc] = []
    if root:
        uses = _kernel_uses(block)
        whole = spans[()]
        for r in block.refs:
            first, last = whole
            if r.into in uses and "input" not in r.tags:
                first = spans[uses[r.into][0]][0]
            if r.into in uses and "output" not in r.tags:
                last = spans[uses[r.into][-1]][1]
            mem = r.location.name if r.location is not None else "DRAM"
            out.append(Alloc((), r.into, mem, _extent(r), (first, last)))
    _locals(block, (), parent, spans, out, skip_own=root)
    return out


def _timeline(b: Block, path: Path, spans: dict[Path, tuple[int, int]], tick: list[int]) -> None:
    start = tick[0]
    tick[0] += 1
    for k, s in enumerate(b.stmts):
        if isinstance(s, Block):
            _timeline(s, (*path, k), spans, tick)
    spans[path] = (start, tick[0])
    tick[0] += 1


def _locals(b: Block, path: Path, parent: Block | None, spans, out: list[Alloc], skip_own=False) -> None:
    if not skip_own:
        for r in b.refs:
            if is_allocation(r, parent) and r.location is not None:
                out.append(Alloc(path, r.into, r.location.name, _extent(r), spans[path]))
    for k, s in enumerate(b.stmts):
        if isinstance(s, Block):
            _locals(s, (*path, k), b, spans, out)


def _kernel_uses(program: Block) -> dict[str, list[Path]]:
    """Root buffer -> the paths of the kernels (statements of ``main``) that refine it, in order."""
    uses: dict[str, list[Path]] = {}
    for m, main in enumerate(program.stmts):
        if not isinstance(main, Block) or "main" not in main.tags:
            continue
        buffer = {r.into: r.source for r in main.refs}
        for k, s in enumerate(main.stmts):
            if isinstance(s, Block):
                for name in dict.fromkeys(buffer[r.source] for r in s.refs if r.source in buffer):
                    uses.setdefault(name, []).append((m, k))
    return uses


def _extent(r: Refinement) -> int:
    """Bytes from the first element of a view to its last."""
    if any(d.size <= 0 for d in r.shape.dims):
        return 0
    last = sum((d.size - 1) * d.stride for d in r.shape.dims)
    return (last + 1) * r.shape.dtype.numpy.itemsize


def _meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _align(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment


# ------------------------------------------------------------------------------ offsets in the tree
def with_offsets(block: Block, offsets: dict[tuple[Path, str], int], path: Path = ()) -> Block:
    refs = tuple(
        replace(r, offset=offsets[(path, r.into)]) if (path, r.into) in offsets else r for r in block.refs
    )
    stmts = tuple(
        with_offsets(s, offsets, (*path, k)) if isinstance(s, Block) else s for k, s in enumerate(block.stmts)
    )
    return replace(block, refs=refs, stmts=stmts)


def _offsets(block: Block, path: Path) -> dict[tuple[Path, str], int | None]:
    out: dict[tuple[Path, str], int | None] = {(path, r.into): r.offset for r in block.refs}
    for k, s in enumerate(block.stmts):
        if isinstance(s, Block):
            out.update(_offsets(s, (*path, k)))
    return out
