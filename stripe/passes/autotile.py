"""``autotile``: split leaf blocks into tiles that fit a memory, choosing the tile sizes that the
cost model (``stripe.cost.TileModel``) says move the fewest bytes per flop.

The search: each index's candidate tile sizes are the powers of two below its range and the range
itself (with ``only_po2=False`` also the range's divisors), capped by ``max_sizes``. Only tilings
whose footprint fits the memory and that keep at least ``min_outer`` outer points over the
output's indexes are priced as candidates. Two hill climbs start from all ones, raising one index
at a time to any larger candidate while the cost strictly improves: one takes the steepest step,
the other the most traffic saved per footprint byte added (then finishes steepest); the better
end is polished by steepest descent over its neighbours (one index to any candidate, or one index
a step down and another up). Every phase prices at most ``Σ candidates`` tilings per step (the
polish about ``indexes x Σ candidates``), so a 6-index convolution with ranges of 1024 takes
about 10 ms. It is not exhaustive, but on the tests' drawn programs it finds the exhaustive
optimum in nearly every block. ``TILE_DEBUG=2`` prints the best candidates
seen, ranked, to stderr. ``choices`` (block name -> k) takes the k-th runner-up of ``ranking``
instead, for the autotuner, which times a few on the device (``backends.tune``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace

from stripe import cost
from stripe.config_types import ConfigError
from stripe.hardware import Hardware
from stripe.ir import Block, Constant, Intrinsic, Load, LoadIndex, RefDir, Store
from stripe.passes.registry import register, search_sites
from stripe.passes.rewrite import Context, reads_writes, rewrite
from stripe.passes.tiling import can_split, parent_sizes, split


@dataclass(frozen=True)
class AutotileConfig:
    reqs: tuple[str, ...]
    memory: str  # a mem_units name: every tile must fit one of them
    outer_set: tuple[str, ...] = ()  # tags added to the outer (tile-loop) block
    inner_set: tuple[str, ...] = ()  # tags of the inner (one-tile) block
    only_po2: bool = False  # tile sizes powers of two (or the whole range)
    max_sizes: dict[str, int] = field(default_factory=dict)  # index name -> largest tile
    min_outer: int = 0  # outer points over the output's indexes to keep (0: the exec units' count)
    split_reductions: bool = True  # False: indexes the output does not use stay whole
    # block name -> which candidate to take: 0 the search's best (the default), k the k-th
    # runner-up by the cost model; the autotuner (backends.tune) times a few and sets these
    choices: dict[str, int] = field(default_factory=dict)
    # reduction tiles at least this long (or whole): a CPU micro-kernel keeps its output tile in
    # registers over the tile's reduction, so short reduction tiles cost a load and a store each
    min_reduction_tile: int = 1


@register("autotile", AutotileConfig, reorders=True)
def autotile(program: Block, cfg: AutotileConfig, hw: Hardware) -> Block:
    """Matches leaf blocks with every tag in ``reqs`` (statements only loads, stores, intrinsics,
    constants and ``load_index``; indexes without affines; every refinement a view of the
    enclosing block's, none both read and written). Replaces each by ``tiling.split`` with the
    tile sizes the cost model ranks best: the outer block keeps the name, tags (plus
    ``outer_set``), comments and location; the inner block gets ``inner_set`` and the location
    (unless its units name the block's indexes).

    Guarantees: the footprint of one tile's refinements (in lines of the memory ``memory``) fits
    that memory; tile sizes respect ``only_po2`` and ``max_sizes``; at least ``min_outer`` outer
    points over the output's indexes when the block has that many (0: the count of the exec unit
    the block's location names, else of all units). Every point still runs once with the same
    elements, but tile by tile, so an element's aggregation may receive its values in another
    order (``reorders``). A block stays as it was when no tiling fits, or when the best is the
    whole block or single points."""
    if cfg.memory not in hw.mem_units:
        raise ConfigError(
            f"autotile: the hardware has no memory '{cfg.memory}'",
            None,
            f"'memory' names one of its mem_units: {', '.join(sorted(hw.mem_units))}",
        )
    debug = os.environ.get("TILE_DEBUG", "0") >= "2"

    def fn(block: Block, ctx: Context) -> Block | None:
        parent = ctx.parent
        if parent is None or not _tileable(block, parent):
            return None
        sizes = parent_sizes(block, parent)
        model = cost.TileModel(block, hw, cfg.memory, sizes)
        best, seen = search(model, cfg, hw)
        if cfg.choices.get(block.name, 0) and best is not None:
            ranked = ranking(best, seen)
            best = ranked[min(cfg.choices[block.name], len(ranked) - 1)]
        if debug:
            print(f"=== autotile {block.name}: {len(seen)} candidates", file=sys.stderr)
            print(model.table(seen), file=sys.stderr)
        if (
            best is None
            or all(t == r for t, r in zip(best.tiles, model.ranges))
            or all(t == 1 for t in best.tiles)
        ):
            return None
        tiles = dict(zip(model.names, best.tiles))
        out = split(
            block,
            tiles,
            outer_tags=set(cfg.outer_set),
            inner_tags=set(cfg.inner_set),
            parent_sizes=sizes,
        )
        loc = block.location
        if loc is None or any(u.vars for u in loc.units):  # units of the block's own indexes
            return out
        return replace(out, stmts=(replace(out.stmts[0], location=loc),))

    return rewrite(program, fn, cfg.reqs)


def _tileable(block: Block, parent: Block) -> bool:
    if not can_split(block):
        return False
    if not all(isinstance(s, (Load, Store, Intrinsic, Constant, LoadIndex)) for s in block.stmts):
        return False
    names = {r.into for r in parent.refs}
    reads, writes = reads_writes(block)
    for r in block.refs:
        if r.source not in names or (r.dir is RefDir.NONE and r.from_ is None and r.into not in names):
            return False
        if r.into in reads and r.into in writes:
            return False
    return True


def candidates(rng: int, only_po2: bool, cap: int | None) -> list[int]:
    """Tile sizes for an index of range ``rng``, ascending: 1, the powers of two below ``rng``,
    ``rng`` itself and, unless ``only_po2``, its divisors; none above ``cap``, which is one itself
    (when ``only_po2`` allows it)."""
    sizes = {rng}
    p = 1
    while p < rng:
        sizes.add(p)
        p *= 2
    if not only_po2:
        sizes.update(d for d in range(1, rng + 1) if rng % d == 0)
    if cap is not None:
        sizes = {s for s in sizes if s <= cap}
        if 1 < cap < rng and not (only_po2 and cap & (cap - 1)):
            sizes.add(cap)
    return sorted(sizes | {1})


def search(model: cost.TileModel, cfg: AutotileConfig, hw: Hardware):
    """The best ``TileCost`` found by the hill climb (None when not even single points fit) and
    every candidate priced that met the limits."""
    owned = model.owned
    cands = []
    for k, (name, rng) in enumerate(zip(model.names, model.ranges)):
        if not cfg.split_reductions and k not in owned:
            cands.append([rng])
        elif k not in owned and cfg.min_reduction_tile > 1:
            least = min(rng, cfg.min_reduction_tile)
            sizes = candidates(rng, cfg.only_po2, cfg.max_sizes.get(name))
            cands.append([c for c in sizes if c >= least] or [rng])
        else:
            cands.append(candidates(rng, cfg.only_po2, cfg.max_sizes.get(name)))
    loc = model.block.location.name if model.block.location is not None else None
    units = [hw.exec_units[loc]] if loc in hw.exec_units else hw.exec_units.values()
    want = cfg.min_outer or sum(u.count for u in units)
    want = min(want, model.max_parallel())
    seen: dict[tuple[int, ...], cost.TileCost | None] = {}

    def price(pos: tuple[int, ...]) -> cost.TileCost | None:
        tiles = tuple(c[p] for c, p in zip(cands, pos))
        if tiles not in seen:
            got = model.evaluate(tiles)
            seen[tiles] = got if got.footprint <= model.capacity and got.parallel >= want else None
        return seen[tiles]

    start = tuple(0 for _ in cands)
    if price(start) is None:
        return None, []

    def climb(pos: tuple[int, ...], by_ratio: bool) -> tuple[int, ...]:
        """Raise one index at a time while the cost improves: to the best cost (steepest), or to
        the best traffic saved per footprint byte added (``by_ratio``, the knapsack greedy that
        grows every index a little before one index takes the whole memory)."""
        here = price(pos)
        while True:
            step, score = None, None
            for k, c in enumerate(cands):
                for p in range(pos[k] + 1, len(c)):
                    trial = (*pos[:k], p, *pos[k + 1 :])
                    got = price(trial)
                    if got is None or not got.key() < here.key():
                        continue
                    if by_ratio:
                        if got.traffic >= here.traffic:
                            continue
                        s = (here.traffic - got.traffic) / max(1, got.footprint - here.footprint)
                        better = score is None or s > score
                    else:
                        s, better = None, step is None or got.key() < price(step).key()
                    if better:
                        step, score = trial, s
            if step is None:
                return pos
            pos, here = step, price(step)

    def polish(pos: tuple[int, ...]) -> tuple[int, ...]:
        """Steepest descent over the neighbours of a climb's end: one index to any other
        candidate, or one index a candidate down and another to any larger one (memory freed by
        one index, given to another)."""
        while True:
            here, step = price(pos), None
            for trial in _neighbours(pos, [len(c) for c in cands]):
                got = price(trial)
                if got is not None and got.key() < (price(step) if step else here).key():
                    step = trial
            if step is None:
                return pos
            pos = step

    ends = [climb(start, False), climb(climb(start, True), False)]
    best = polish(min(ends, key=lambda e: price(e).key()))
    return price(best), [c for c in seen.values() if c is not None]


@search_sites("autotile")
def sites(program: Block, cfg: AutotileConfig, hw: Hardware) -> dict[str, list[cost.TileCost]]:
    """Each block this step would tile, by name, with its ``ranking``: what an autotuner can
    choose from (the program is left as it is)."""
    out: dict[str, list[cost.TileCost]] = {}

    def fn(block: Block, ctx: Context) -> None:
        if ctx.parent is not None and _tileable(block, ctx.parent):
            model = cost.TileModel(block, hw, cfg.memory, parent_sizes(block, ctx.parent))
            best, seen = search(model, cfg, hw)
            if best is not None:
                out[block.name] = ranking(best, seen)
        return None

    rewrite(program, fn, cfg.reqs)
    return out


def ranking(best: cost.TileCost, seen: list[cost.TileCost]) -> list[cost.TileCost]:
    """The search's choice, then every other candidate it priced, cheapest first by the cost
    model: what ``choices`` indexes (an autotuner times the first few on the device)."""
    rest = sorted((c for c in seen if c.tiles != best.tiles), key=lambda c: c.key())
    return [best, *rest]


def _neighbours(pos: tuple[int, ...], sizes: list[int]):
    n = len(pos)
    for k in range(n):
        for p in range(sizes[k]):
            if p != pos[k]:
                yield (*pos[:k], p, *pos[k + 1 :])
    for down in range(n):
        if pos[down] == 0:
            continue
        for up in range(n):
            if up == down:
                continue
            for p in range(pos[up] + 1, sizes[up]):
                trial = list(pos)
                trial[down] -= 1
                trial[up] = p
                yield tuple(trial)
