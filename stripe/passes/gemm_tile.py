"""``gemm_tile``: a GEMM-shaped contraction kernel as the explicit nest of a work-group-tiled GPU
kernel: work-group tiles, a K-step loop, operand tiles staged in a local memory, work-items and
their register blocks.

Matches kernels (children of ``#main``) with every tag in ``reqs`` and none in ``skip`` that
``stripe.gemm.match`` accepts in Stripe's K order (flat, or fused with an elementwise epilogue),
whose indexes all start at 0. The tiles come from ``GemmModel`` (the cost model below):
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
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace

from stripe.config_types import ConfigError
from stripe.gemm import Gemm, match
from stripe.gemm_model import GemmModel, GemmTiles, index_tiles, k_tiles
from stripe.hardware import Hardware
from stripe.ir import Block, Dim, Index, Load, Location, RefDir, Refinement, Store, TensorShape
from stripe.ir import dense_strides as _dense_strides
from stripe.passes.registry import register, search_sites
from stripe.passes.rewrite import Context, fresh, rewrite
from tile.affine import Affine
from tile.dtypes import DType


@dataclass(frozen=True)
class GemmTileConfig:
    reqs: tuple[str, ...]
    memory: str = "LOCAL"  # where the operand tiles are staged
    acc_memory: str = "REGISTER"  # where a fused kernel's accumulator tile lives
    sides: tuple[int, ...] = (128, 64, 32)  # work-group tile sides (flat M or N), powers of two
    registers: tuple[int, ...] = (8, 4)  # register block sides, multiples of 4
    k_steps: tuple[int, ...] = (8, 16)  # K steps (flat), largest kept while registers allow
    group_set: tuple[str, ...] = ("gpu_group",)
    kstep_set: tuple[str, ...] = ("gpu_kstep",)
    fill_set: tuple[str, ...] = ("gpu_fill",)
    thread_set: tuple[str, ...] = ("gpu_thread",)
    reg_set: tuple[str, ...] = ("reg",)
    skip: tuple[str, ...] = ("split_partial",)
    choices: dict[str, int] = field(default_factory=dict)
    model: str = "gpu"  # "cpu": GemmModel.cpu_rule's tiles (cache blocks for a CPU code generator)
    panel: tuple[int, int] = (6, 64)  # cpu: the code generator's register tile, MR rows x NR columns


# ------------------------------------------------------------------------------ the layout
@dataclass(frozen=True)
class Piece:
    """Bits ``[lo, lo + width)`` of index ``var``'s tile value, held by index ``name`` of the
    ``level`` (``t`` thread, ``c``/``q`` register) block."""

    var: str
    level: str
    name: str
    range: int
    mult: int  # its weight in the index's value within the tile


def pieces(idxs: tuple[Index, ...], tiles: dict[str, int], t: int, r: int, taken: set[str]) -> list[Piece]:
    """The row (column) layout of the module docstring for a flat tile ``t`` with register side
    ``r``: fields ``q`` (2 bits), ``t`` (log2 t/r), ``c`` (log2 r/4), from the least bit; each
    index (the last fastest) a bit field. In field order, most significant piece first."""
    fields = [("q", 0, 2), ("t", 2, 2 + (t // r).bit_length() - 1), ("c", 2 + (t // r).bit_length() - 1,
                                                                     t.bit_length() - 1)]
    out: list[Piece] = []
    at = {}
    lo = 0
    for ix in reversed(idxs):
        at[ix.name] = lo
        lo += tiles[ix.name].bit_length() - 1
    for level, f0, f1 in fields:
        got = []
        for ix in idxs:
            v0, v1 = at[ix.name], at[ix.name] + tiles[ix.name].bit_length() - 1
            a, b = max(v0, f0), min(v1, f1)
            if a < b:
                name = fresh(f"{ix.name}_{level}", taken)
                taken.add(name)
                got.append(Piece(ix.name, level, name, 1 << (b - a), 1 << (a - v0)))
        out.extend(got)
    return out


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
        if got is None:
            return None
        ranked = GemmModel(got, hw, cfg).ranking()
        if not ranked:
            return None
        tiles = ranked[min(cfg.choices.get(block.name, 0), len(ranked) - 1)]
        if debug:
            shown = ", ".join(f"{t.suffix} {t.cost:.3g}" for t in ranked[:6])
            print(f"=== gemm_tile {block.name}: {shown}", file=sys.stderr)
        return build(block, ctx.parent, got, tiles, cfg)

    return rewrite(program, fn, cfg.reqs)


def analyze(block: Block, parent: Block | None, cfg: GemmTileConfig) -> Gemm | None:
    """The ``Gemm`` of a kernel this pass tiles (Stripe's K order), or None."""
    if parent is None or "main" not in parent.tags or any(t in block.tags for t in cfg.skip):
        return None
    buffers = tuple(r.into for r in parent.refs)
    g = match(block, buffers, {r.into: r.shape.dtype for r in parent.refs}, reorder=False)
    if g is None or any(g.starts.values()) or any(not a.is_integral for a in g.a.access + g.b.access):
        return None
    if g.epilogue is not None:
        kb, local = g.epilogue
        used = _epilogue_refs(kb)
        names = {r.into for r in parent.refs}
        for r in kb.refs:
            if r.into in used and r.into != local.into and (r.source not in names or r in (g.a.ref, g.b.ref)):
                return None  # a local of its own, or an operand's view the epilogue reads too
    return g


@search_sites("gemm_tile")
def sites(program: Block, cfg: GemmTileConfig, hw: Hardware) -> dict[str, list[GemmTiles]]:
    """Each kernel this step would tile, by name, with its ranking (for ``backends.tune``)."""
    out: dict[str, list[GemmTiles]] = {}

    def fn(block: Block, ctx: Context) -> None:
        got = analyze(block, ctx.parent, cfg)
        if got is not None:
            ranked = GemmModel(got, hw, cfg).ranking()
            if ranked:
                out[block.name] = ranked
        return None

    rewrite(program, fn, cfg.reqs)
    return out


def _epilogue_refs(kb: Block) -> set[str]:
    return {s.from_ for s in kb.stmts[1:] if isinstance(s, Load)} | {
        s.into for s in kb.stmts[1:] if isinstance(s, Store)
    }


def _scalar(shape: TensorShape) -> TensorShape:
    return TensorShape(shape.dtype, tuple(Dim(1, d.stride) for d in shape.dims))


def _dense(dtype: DType, sizes: list[int]) -> TensorShape:
    return TensorShape(dtype, tuple(Dim(s, k) for s, k in zip(sizes, _dense_strides(tuple(sizes)))))


# ------------------------------------------------------------------------------ the nest
class _Levels:
    """Where each index's value comes from: per level (``G`` work-group tile number, ``S`` K step,
    ``F`` fill, ``T`` thread, ``R`` register), the indexes holding a share of it and their
    weights; and the passthrough name of each enclosing level's index."""

    def __init__(self, g: Gemm, tiles: dict[str, int], t: GemmTiles, taken: set[str]):
        self.share: dict[str, dict[str, list[tuple[str, int]]]] = {}
        for ix in g.batch.idxs:
            self.share[ix.name] = {"G": [(ix.name, 1)]}
        self.pieces: dict[str, list[Piece]] = {}
        for grp, side, reg in ((g.m, t.tm, t.rm), (g.n, t.tn, t.rn)):
            ps = pieces(grp.idxs, tiles, side, reg, taken)
            for level in ("q", "t", "c"):
                self.pieces.setdefault(level, []).extend(p for p in ps if p.level == level)
            for ix in grp.idxs:
                own = [p for p in ps if p.var == ix.name]
                self.share[ix.name] = {
                    "G": [(ix.name, tiles[ix.name])],
                    "F": [(ix.name, 1)],
                    "T": [(p.name, p.mult) for p in own if p.level == "t"],
                    "R": [(p.name, p.mult) for p in own if p.level != "t"],
                }
        for ix in g.k.idxs:
            self.share[ix.name] = {"S": [(ix.name, tiles[ix.name])], "F": [(ix.name, 1)], "R": [(ix.name, 1)]}
        self.through: dict[tuple[str, str], str] = {}
        for by in self.share.values():
            for level, parts in by.items():
                for name, _ in parts:
                    if level in "GST" and (level, name) not in self.through:
                        self.through[(level, name)] = fresh(f"{name}_o", taken)
                        taken.add(self.through[(level, name)])

    def part(self, a: Affine, level: str) -> Affine:
        """``a``'s share held at ``level`` (the constant at ``G``)."""
        out = Affine.constant(a.const if level == "G" else 0)
        for v, c in a.terms:
            for name, w in self.share[v].get(level, ()):
                out = out + Affine.var(name) * (int(c) * w)
        return out

    def whole(self, a: Affine, path: str) -> tuple[Affine, set[tuple[str, str]]]:
        """``a`` in a block at the end of ``path`` (levels, outermost first): its own level's
        indexes by name, the enclosing ones' through passthroughs (returned too)."""
        out, used = Affine.constant(a.const), set()
        for v, c in a.terms:
            for level in path:
                for name, w in self.share[v].get(level, ()):
                    if level != path[-1]:
                        used.add((level, name))
                        name = self.through[(level, name)]
                    out = out + Affine.var(name) * (int(c) * w)
        return out, used


def build(kb: Block, parent: Block, g: Gemm, t: GemmTiles, cfg: GemmTileConfig) -> Block:
    """The nest of the module docstring for kernel ``kb`` with tiles ``t``."""
    mtiles = index_tiles(g.m.idxs, t.tm)
    ntiles = index_tiles(g.n.idxs, t.tn)
    tiles = {**mtiles, **ntiles, **{ix.name: 1 for ix in g.batch.idxs}, **k_tiles(g.k.idxs, t.kt)}
    ranges = {ix.name: ix.range for grp in (g.m, g.n, g.k, g.batch) for ix in grp.idxs}
    # new names (indexes, the staged tiles) avoid the kernel's own: #main's other buffers are not
    # in scope below it (and the code generator, which rebuilds the nest to check it, sees only
    # the kernel's)
    taken = set(ranges) | {r.into for r in kb.refs}
    if g.epilogue is not None:
        taken |= {r.into for r in g.epilogue[0].stmts[0].refs}
    lv = _Levels(g, tiles, t, taken)
    main = {r.into: r for r in parent.refs}
    dt = g.dtype
    M, N, K = g.m.idxs, g.n.idxs, g.k.idxs

    def edges(names) -> list[Affine]:
        return [Affine.constant(ranges[v] - 1) - Affine.var(v) for v in names if ranges[v] % tiles[v]]

    def cons(affs: list[Affine], path: str) -> tuple[tuple[Affine, ...], set]:
        out, used = [], set()
        for c in affs:
            got, u = lv.whole(c, path)
            out.append(got)
            used |= u
        return tuple(out), used

    def whole_view(r: Refinement, access: tuple[Affine, ...], level: str, dir_=None, agg=None) -> Refinement:
        return Refinement(
            dir_ or r.dir,
            r.into,
            tuple(lv.part(a, level) for a in access),
            TensorShape(r.shape.dtype, main[r.source].shape.dims),
            r.from_ if level == "G" else None,
            r.agg_op if agg is None else agg,
            r.location if level == "G" else None,
            r.is_const,
            r.tags if level == "G" else frozenset(),
        )

    def local_view(name: str, shape: TensorShape, vars_: list[str], level: str, dir_, agg="", into=None):
        """A view of a tile allocation whose dims are ``vars_``: each dim's share at ``level``."""
        acc = tuple(lv.part(Affine.var(v), level) if v in lv.share else Affine.constant(0) for v in vars_)
        scalar = level in ("F", "R")
        return Refinement(
            dir_, into or name, acc, _scalar(shape) if scalar else shape, name if into else None, agg
        )

    # ---- the operand tiles and their fills
    a_vars = [ix.name for ix in M + K]
    b_vars = [ix.name for ix in K + N]
    a_name, b_name = fresh(f"{g.a.ref.into}_l", taken), ""
    taken.add(a_name)
    b_name = fresh(f"{g.b.ref.into}_l", taken)
    taken.add(b_name)
    a_shape = _dense(dt, [tiles[v] for v in a_vars])
    b_shape = _dense(dt, [tiles[v] for v in b_vars])
    fills, fill_used = [], set()
    for op, name, shape, vars_ in ((g.a, a_name, a_shape, a_vars), (g.b, b_name, b_shape, b_vars)):
        c, used = cons(list(op.guards) + edges(vars_), "GSF")
        fill_used |= used
        src = replace(op.ref, shape=(op.leaf or op.ref).shape)
        refs = (
            Refinement(RefDir.IN, op.ref.into, tuple(lv.part(a, "F") for a in op.access), _scalar(src.shape)),
            local_view(name, shape, vars_, "F", RefDir.OUT, "assign"),
        )
        idxs = tuple(Index(v, tiles[v]) for v in vars_)
        stmts = (Load(op.ref.into, "$x"), Store("$x", name))
        fills.append([idxs, c, refs, stmts, used])

    # ---- the products
    guards = list(dict.fromkeys(g.a.guards + g.b.guards + g.store_guards))
    mn_vars = [ix.name for ix in M + N]
    acc_shape = _dense(dt, [tiles[v] for v in mn_vars])
    if g.epilogue is None:
        out, body = g.out, kb
        out_leaf = out.leaf or out.ref
        out_chain = {
            "G": whole_view(out.ref, out.access, "G"),
            "S": whole_view(out.ref, out.access, "S", agg="add"),
            "T": whole_view(out.ref, out.access, "T", agg="add"),
            "R": replace(whole_view(out.ref, out.access, "R", agg="add"), shape=out_leaf.shape),
        }
    else:
        kb_, local = g.epilogue
        body = kb_.stmts[0]
        leaf = next(r for r in body.refs if r.source == local.into)
        acc = local.into
        out_chain = {
            "G": Refinement(RefDir.NONE, acc, tuple(Affine.constant(0) for _ in mn_vars), acc_shape,
                            location=Location(cfg.acc_memory), agg_op=local.agg_op),
            "S": local_view(acc, acc_shape, mn_vars, "S", RefDir.OUT, leaf.agg_op),
            "T": local_view(acc, acc_shape, mn_vars, "T", RefDir.OUT, leaf.agg_op),
            "R": local_view(acc, acc_shape, mn_vars, "R", RefDir.OUT, leaf.agg_op, into=leaf.into),
        }
    c_mul, mul_used = cons(guards + edges(a_vars + [ix.name for ix in N]), "GSTR")
    body_refs = {r.into: r for r in body.refs}
    la = (g.a.leaf or g.a.ref).into
    lb = (g.b.leaf or g.b.ref).into
    reg_refs = (
        local_view(a_name, a_shape, a_vars, "R", RefDir.IN, into=la),
        local_view(b_name, b_shape, b_vars, "R", RefDir.IN, into=lb),
        out_chain["R"],
    )
    reg_refs = tuple(sorted(reg_refs, key=lambda r: list(body_refs).index(r.into)))
    reg_idxs = tuple(Index(v, tiles[v]) for v in (ix.name for ix in K))
    reg_pieces = [p for p in lv.pieces["c"] + lv.pieces["q"] if p.var in mtiles] + [
        p for p in lv.pieces["c"] + lv.pieces["q"] if p.var in ntiles
    ]
    thread_pieces = lv.pieces["t"]
    reg = Block(
        "",
        reg_idxs + tuple(Index(p.name, p.range) for p in reg_pieces) + _throughs(lv, mul_used, "GSTR"),
        c_mul,
        reg_refs,
        body.stmts,
        frozenset(cfg.reg_set),
    )
    thread = Block(
        "",
        tuple(Index(p.name, p.range) for p in thread_pieces) + _throughs(lv, mul_used, "GST"),
        (),
        (
            local_view(a_name, a_shape, a_vars, "T", RefDir.IN),
            local_view(b_name, b_shape, b_vars, "T", RefDir.IN),
            out_chain["T"],
        ),
        (reg,),
        frozenset(cfg.thread_set),
    )
    fill_blocks = tuple(
        Block("", idxs + _throughs(lv, used, "GSF"), c, refs, stmts, frozenset(cfg.fill_set))
        for idxs, c, refs, stmts, used in fills
    )
    kstep_refs = (
        whole_view(g.a.ref, g.a.access, "S", dir_=RefDir.IN),
        whole_view(g.b.ref, g.b.access, "S", dir_=RefDir.IN),
        out_chain["S"],
        Refinement(RefDir.NONE, a_name, tuple(Affine.constant(0) for _ in a_vars), a_shape,
                   location=Location(cfg.memory)),
        Refinement(RefDir.NONE, b_name, tuple(Affine.constant(0) for _ in b_vars), b_shape,
                   location=Location(cfg.memory)),
    )
    kstep = Block(
        "",
        tuple(Index(ix.name, -(-ix.range // tiles[ix.name])) for ix in K)
        + _throughs(lv, fill_used | mul_used, "GS"),
        (),
        kstep_refs,
        (*fill_blocks, thread),
        frozenset(cfg.kstep_set),
    )
    group_refs = [whole_view(g.a.ref, g.a.access, "G", dir_=RefDir.IN),
                  whole_view(g.b.ref, g.b.access, "G", dir_=RefDir.IN), out_chain["G"]]
    stmts: list = [kstep]
    if g.epilogue is not None:
        kb_, local = g.epilogue
        used_names = _epilogue_refs(kb_)
        erefs = [r for r in kb_.refs if r.into in used_names and r.into != local.into]
        c_epi, epi_used = cons(list(g.store_guards) + edges(mn_vars), "GTR")
        epi_reg = Block(
            "",
            tuple(Index(p.name, p.range) for p in reg_pieces) + _throughs(lv, epi_used, "GTR"),
            c_epi,
            tuple(replace(whole_view(r, r.access, "R"), shape=r.shape) for r in erefs)
            + (local_view(local.into, acc_shape, mn_vars, "R", RefDir.IN),),
            kb_.stmts[1:],
            frozenset(cfg.reg_set),
        )
        epi_thread = Block(
            "",
            tuple(Index(p.name, p.range) for p in thread_pieces) + _throughs(lv, epi_used, "GT"),
            (),
            tuple(whole_view(r, r.access, "T") for r in erefs)
            + (local_view(local.into, acc_shape, mn_vars, "T", RefDir.IN),),
            (epi_reg,),
            frozenset(cfg.thread_set),
        )
        group_refs += [whole_view(r, r.access, "G") for r in erefs]
        stmts.append(epi_thread)
    return replace(
        kb,
        idxs=tuple(Index(ix.name, -(-ix.range // tiles[ix.name])) for ix in g.batch.idxs + M + N),
        constraints=(),
        refs=tuple(group_refs),
        stmts=tuple(stmts),
        tags=kb.tags | frozenset(cfg.group_set),
    )


def _throughs(lv: _Levels, used: set[tuple[str, str]], path: str) -> tuple[Index, ...]:
    """The passthroughs of the block at the end of ``path``: the enclosing levels' indexes that it
    or a block inside it uses, each reading its parent's index (its own, or its passthrough)."""
    out = []
    for lev, name in sorted(used, key=lambda u: ("GSFTR".index(u[0]), u[1])):
        if lev not in path[:-1]:
            continue
        src = name if path[-2] == lev else lv.through[(lev, name)]
        out.append(Index(lv.through[(lev, name)], 1, Affine.var(src)))
    return tuple(out)
