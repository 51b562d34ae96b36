"""``gemm_tile``: a GEMM-shaped contraction kernel as the explicit nest of a work-group-tiled GPU
kernel: work-group tiles, a K-step loop, operand tiles staged in a local memory, work-items and
their register blocks.

Matches kernels (children of ``#main``) with every tag in ``reqs`` and none in ``skip`` that
``stripe.gemm.match`` accepts in Stripe's K order (flat, or fused with an elementwise epilogue),
whose indexes all start at 0. The tiles come from ``GemmModel`` (``stripe.gemm_model``):
work-group tile ``tm x tn`` (flat over the M and N groups), register block ``rm x rn`` per
work-item, K step ``kt``; then per index: M and N tiles are powers of two whose product is
``tm`` (``tn``), chosen to pad the fewest points (a 56x56 image takes 8x8, not 1x128); batch
indexes have tile 1; K tiles keep Stripe's order (``1, .., 1, t, whole, .., whole``). The kernel
``KER`` becomes (names: ``v`` an index of the kernel, ``T_v`` its tile; ``[..]`` views)::

    KER [batch b: r_b, M/N v: ceil(r_v/T_v)]           #<KER's tags> #group_set
        refs: every buffer KER uses, whole, at the tile's origin (access Σ c·T_v·v + const);
              fused: the accumulator, a local allocation (acc_memory) of dims (T_m.., T_n..)
      [k: ceil(r_k/KT_k)]                               #kstep_set
          refs: the operands and the output (or accumulator), offset by k's origin (KT_k·k);
                A_l (dims T_m.., KT_k..) and B_l (KT_k.., T_n..): local allocations in ``memory``
        [m.., k..: tiles]   load A, store A_l            #fill_set   (A's guards, edges)
        [k.., n..: tiles]   load B, store B_l            #fill_set   (B's guards, edges)
        [thread pieces]                                  #thread_set
          [register pieces, k..: KT_k]  the contraction's own statements, reading A_l and B_l,
                                        adding into the output (fused: the accumulator)
                                        #reg_set     (every constraint, edges)
      fused only:
      [thread pieces]                                    #thread_set
        [register pieces]  the epilogue's statements, its local reading the accumulator
                                                         #reg_set    (store guards, edges)

Work-items and registers follow the code generator's layout (``backends.clike.tiled``): a row
``r`` of the flat M tile is ``c·(tm·4/rm) + ty·4 + q`` (``q < 4``, ``ty < tm/rm`` the work-item's
row, ``c < rm/4``), a column likewise with ``tx``; an index's tile is a bit field of the row, so
its value is a sum of pieces of those fields: the thread block has the ``ty`` and ``tx`` pieces
(named ``v_t``; M's first, each group's fastest index last), the register blocks the ``c`` and
``q`` pieces (``v_c``, ``v_q``) then K. Accesses are split over the levels (each level adds its
own pieces' share). A constraint is written over the whole value of each index, the enclosing
levels' parts reaching it through range-1 passthroughs (``v_o``: ``v``'s tile number, ``v_t``
...); an index whose tile does not divide its range gets ``r - 1 - v >= 0`` (an *edge*) in the
blocks that use it. Skipped points stay zeros in ``A_l``/``B_l`` and are never multiplied.

Meaning: every (M, N, batch) point gets the products of its K points in Stripe's order (K tiles
keep it), each added once, so every element is exactly what the kernel computed, in the same
order (not ``reorders``); a fused element's sum starts at zero in its accumulator, as the local
did. Params: ``memory`` / ``acc_memory`` (mem_units names), the candidate ``sides``,
``registers`` (multiples of 4) and ``k_steps``, the tags of each level, ``skip``, and ``choices``
(kernel name -> rank in ``GemmModel.ranking``, for the autotuner ``backends.tune``); ``model``
``cpu`` (``llvm_cpu``) ranks one choice, ``GemmModel.cpu_rule``'s cache tiles from ``L1``/``L2``
and ``panel`` (the CPU code generator's register tile), whose nest the LLVM backend reads back.

On a matrix unit: a kernel ``tensorize`` marked (``mma_<mode>``), when the hardware has the unit
named by ``matrix_unit``, takes ``GemmModel.mma_ranking``'s tiles (``mma_tiles``, ``warps`` warps
per work-group: each work-item of the nest is a warp, its register block a grid of the unit's
operations) and a row layout whose ``q`` field is 3 bits (eight contiguous rows: the rows one
fragment load reads), and its plan names the unit and mode (``GemmPlan.unit``). 16-bit floats are
tiled only then (the SIMT code generator stages float32 and float64).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from stripe.config_types import ConfigError
from stripe.gemm import Gemm, match
from stripe.gemm_model import GemmModel, GemmTiles
from stripe.hardware import Hardware, MatrixUnit
from stripe.ir import Block, LoadIndex
from stripe.passes.gemm_tile_nest import GemmTileConfig, build, epilogue_refs
from stripe.passes.registry import register, search_sites
from stripe.passes.rewrite import Context, rewrite
from stripe.passes.tiling import tables_of

# ``flat_points`` under the ``generic`` setting (``backends.driver.config_for``): short GEMMs stay flat
# kernels, whose integers are the extents alone, and ``backends.llvm.generic`` runs them as plain
# loops with run-time extents (one template for every short length); the nest's tiles (M whole:
# the next power of two) made a new template at each power of two
GENERIC_FLAT_POINTS = 1 << 15
# ``flat_k`` under ``generic``: a GEMM summing at most this many points a result stays flat at any
# size, its fused epilogue with it, as plain loops with run-time extents: its loads are not reused
# over a long reduction, which is what the micro-kernel's register tiles are for, while its nest
# cost every new shape the nest's build (the attention's Q K^T + R, head size 8: 5 ms a length)
# and its own generic product template (0.4-0.5 s, at S = 80)
GENERIC_FLAT_K = 16


MMA_TAG = "mma_"  # + the precision mode: the tag ``tensorize`` marks a kernel with
SPLIT_TAG = "split_3xtf32"  # a 3xtf32 GEMM reading operands split into TF32 parts (``kmajor``)


def marked(block: Block) -> str | None:
    """The precision mode ``tensorize`` marked ``block`` with (``f16``, ``tf32``, ...), or None."""
    for t in block.tags:
        if t.startswith(MMA_TAG):
            return t[len(MMA_TAG):]
    return None


# ------------------------------------------------------------------------------ the pass
@register("gemm_tile", GemmTileConfig, kernel_tiling=True)
def gemm_tile(program: Block, cfg: GemmTileConfig, hw: Hardware) -> Block:
    """Rewrites each matched kernel into the nest of the module docstring, with the tiles that
    ``GemmModel.ranking`` ranks first (or ``choices``' rank). Kernels it cannot match stay."""
    for what, name in (("memory", cfg.memory), ("acc_memory", cfg.acc_memory)):
        if name not in hw.mem_units:
            raise ConfigError(
                f"gemm_tile: the hardware has no memory '{name}'",
                None,
                f"'{what}' names one of its mem_units: {', '.join(sorted(hw.mem_units))}",
            )
    debug = os.environ.get("TILE_DEBUG", "0") >= "2"

    def fn(block: Block, ctx: Context) -> Block | None:
        got = analyze(block, ctx.parent, cfg)
        if got is None or flat(got, cfg):
            return None
        ranked = ranking(block, got, hw, cfg)
        if not ranked:
            return None
        tiles = ranked[min(cfg.choices.get(block.name, 0), len(ranked) - 1)]
        if debug:
            shown = ", ".join(f"{t.suffix} {t.cost:.3g}" for t in ranked[:6])
            print(f"=== gemm_tile {block.name}: {shown}", file=sys.stderr)
        return build(block, ctx.parent, got, tiles, cfg)

    return rewrite(program, fn, cfg.reqs)


def analyze(block: Block, parent: Block | None, cfg: GemmTileConfig, halves: bool = False) -> Gemm | None:
    """The ``Gemm`` of a kernel this pass tiles (Stripe's K order), or None. 16-bit floats only
    with ``halves`` (what ``tensorize`` considers) or once ``tensorize`` marked the kernel: the
    SIMT kernels stage float32 and float64 only."""
    if parent is None or "main" not in parent.tags or any(t in block.tags for t in cfg.skip):
        return None
    views = tables_of(parent)  # (one table per parent: per kernel it made the pass quadratic)
    g = match(block, views.names, views.dtypes, reorder=False, halves=halves or marked(block) is not None)
    if g is None or any(g.starts.values()) or any(not a.is_integral for a in g.a.access + g.b.access):
        return None
    if g.epilogue is not None:
        kb, local = g.epilogue
        if cfg.model == "cpu" and any(isinstance(s, LoadIndex) for s in kb.stmts):
            return None  # (a mask's index: the CPU's plain loops read only the tiles' own indexes)
        used = epilogue_refs(kb)
        names = views.by_name
        for r in kb.refs:
            if r.into in used and r.into != local.into and (r.source not in names or r in (g.a.ref, g.b.ref)):
                return None  # a local of its own, or an operand's view the epilogue reads too
    return g


def flat(g: Gemm, cfg: GemmTileConfig) -> bool:
    """Whether the GEMM ``g`` stays flat: at most ``cfg.flat_points`` points, at most
    ``cfg.flat_k`` reduction points, or no fused epilogue under ``cfg.flat_unfused``."""
    if (cfg.flat_unfused and g.epilogue is None) or g.k.total <= cfg.flat_k:
        return True
    return g.batch.total * g.m.total * g.n.total * g.k.total <= cfg.flat_points


@search_sites("gemm_tile")
def sites(program: Block, cfg: GemmTileConfig, hw: Hardware) -> dict[str, list[GemmTiles]]:
    """Each kernel this step would tile, by name, with its ranking (for ``backends.tune``)."""
    out: dict[str, list[GemmTiles]] = {}

    def fn(block: Block, ctx: Context) -> None:
        got = analyze(block, ctx.parent, cfg)
        if got is not None and not flat(got, cfg):
            ranked = ranking(block, got, hw, cfg)
            if ranked:
                out[block.name] = ranked
        return None

    rewrite(program, fn, cfg.reqs)
    return out


# (block, gemm, model, unit, name, mode) -> tiles ranked before the unit's own
Ranking = Callable[[Block, Gemm, GemmModel, MatrixUnit, str, str], list[GemmTiles]]
_RANKINGS: list[Ranking] = []


def register_ranking(fn: Ranking) -> None:
    """Adds tiles a backend's own kernels take on the matrix unit (kernels it launches with more
    local memory, say: facts of the backend, not of the hardware model), ranked before the
    unit's others for a GEMM ``tensorize`` marked. A backend's module registers when imported
    (a config's ``"pass_modules"`` imports it); registering the same function again does nothing."""
    if fn not in _RANKINGS:
        _RANKINGS.append(fn)


def ranking(block: Block, g: Gemm, hw: Hardware, cfg: GemmTileConfig) -> list[GemmTiles]:
    """The model's choices for ``block``: on the matrix unit when ``tensorize`` marked it and the
    hardware has the unit (its tiles fit; first the tiles of its warp-group products where it has
    them for the mode, ``MatrixUnit.warpgroup``), else the SIMT ones."""
    model = GemmModel(g, hw, cfg)
    mode = marked(block)
    unit = hw.matrix_units.get(cfg.matrix_unit) if mode and cfg.matrix_unit else None
    if unit is not None:
        name = f"{cfg.matrix_unit}.{mode}"
        got = model.mma_ranking(unit, name, mode, cfg.warps, cfg.mma_tiles)
        wg = unit.warpgroup
        if wg is not None and mode in wg.modes:  # the warp-group products' tiles first
            got = model.mma_ranking(unit, name, mode, wg.warps, wg.sides(g.n.total), wg.k_bytes) + got
        # and before them, those of kernels a backend launches its own way (``register_ranking``)
        for extra in _RANKINGS:
            got = extra(block, g, model, unit, name, mode) + got
        if got:
            return got
    return model.ranking()
