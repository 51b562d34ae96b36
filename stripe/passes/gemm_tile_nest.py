"""The nest ``gemm_tile`` writes (its module docstring draws it): the row and column layout of a
work-group tile over work-items and register blocks (``pieces``), the levels each index's value is
split over (``_Levels``), and the blocks themselves (``build``); and the pass's config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from stripe.gemm import Gemm
from stripe.gemm_model import GemmTiles, index_tiles, k_tiles
from stripe.ir import Block, Dim, Index, Load, Location, RefDir, Refinement, Store, TensorShape
from stripe.ir import dense_strides as _dense_strides
from stripe.passes.rewrite import fresh
from stripe.plans import GemmPlan
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
    matrix_unit: str = ""  # the hardware's matrix unit that kernels ``tensorize`` marked run on
    warps: tuple[int, int] = (2, 2)  # on the unit: warps along M and N of a work-group tile
    mma_tiles: tuple[tuple[int, int], ...] = ((128, 128), (128, 64), (64, 128), (64, 64))  # on the unit
    # a GEMM of at most this many points (batch x M x N x K) stays flat (0, -1: none); shape-generic
    # builds set it (``GENERIC_FLAT_POINTS``) where it is 0, since the nest's tiles follow the extents
    flat_points: int = 0
    # a GEMM without a fused epilogue stays flat whatever its size: shape-generic builds set it (the
    # LLVM backend runs their products as its micro-kernel with run-time tiles, which read nothing
    # of a nest, and builds the nest only to read its flat GEMM back)
    flat_unfused: bool = False
    # a GEMM whose reduction has at most this many points stays flat (0: none): shape-generic builds
    # set it (``GENERIC_FLAT_K``)
    flat_k: int = 0


QUAD_BITS = {False: 2, True: 3}  # the layout's q field: SIMT (float4 reads), matrix unit (8 rows)


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


def pieces(
    idxs: tuple[Index, ...], tiles: dict[str, int], t: int, r: int, taken: set[str], q: int = 2
) -> list[Piece]:
    """The row (column) layout of the module docstring for a flat tile ``t`` with register side
    ``r``: fields ``q`` (``q`` bits: 2, or 3 on a matrix unit, whose operand fragments load eight
    contiguous rows), ``t`` (log2 t/r), ``c`` (the rest), from the least bit; each index (the last
    fastest) a bit field. In field order, most significant piece first."""
    tb = (t // r).bit_length() - 1
    fields = [("q", 0, q), ("t", q, q + tb), ("c", q + tb, t.bit_length() - 1)]
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


def epilogue_refs(kb: Block) -> set[str]:
    """The buffers a fused kernel's epilogue (its statements after the contraction) reads or writes."""
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
            ps = pieces(grp.idxs, tiles, side, reg, taken, QUAD_BITS[bool(t.unit)])
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

    def throughs(self, used: set[tuple[str, str]], path: str) -> tuple[Index, ...]:
        """The passthroughs of the block at the end of ``path``: the enclosing levels' indexes that it
        or a block inside it uses, each reading its parent's index (its own, or its passthrough)."""
        out = []
        for lev, name in sorted(used, key=lambda u: ("GSFTR".index(u[0]), u[1])):
            if lev not in path[:-1]:
                continue
            src = name if path[-2] == lev else self.through[(lev, name)]
            out.append(Index(self.through[(lev, name)], 1, Affine.var(src)))
        return tuple(out)


@dataclass(frozen=True)
class _Tile:
    """A tile allocation: its name, its dense shape, and the kernel's index along each dim."""

    name: str
    shape: TensorShape
    vars: tuple[str, ...]


def build(kb: Block, parent: Block, g: Gemm, t: GemmTiles, cfg: GemmTileConfig) -> Block:
    """The nest of the module docstring for kernel ``kb`` with tiles ``t``."""
    return _Nest(kb, parent, g, t, cfg).group()


class _Views:
    """A kernel's indexes and refs as one level of its nest sees them: each index's tile and the
    indexes holding its value per level (``_Levels``), hence each level's indexes
    (``tile_numbers``), its constraints over its enclosing levels' indexes (``constraints``, with the
    ``edges``), its views of the kernel's refs (``whole_view``) and of tile allocations
    (``local_view``, ``allocation``)."""

    def __init__(self, kb: Block, parent: Block, g: Gemm, t: GemmTiles):
        self.kb, self.g = kb, g
        self.mtiles = index_tiles(g.m.idxs, t.tm)
        self.ntiles = index_tiles(g.n.idxs, t.tn)
        self.tiles = {
            **self.mtiles, **self.ntiles, **{ix.name: 1 for ix in g.batch.idxs}, **k_tiles(g.k.idxs, t.kt)
        }
        self.ranges = {ix.name: ix.range for grp in (g.m, g.n, g.k, g.batch) for ix in grp.idxs}
        # new names (indexes, the staged tiles) avoid the kernel's own: #main's other buffers are not
        # in scope below it (and the code generator, which rebuilds the nest to check it, sees only
        # the kernel's)
        self.taken = set(self.ranges) | {r.into for r in kb.refs}
        if g.epilogue is not None:
            self.taken |= {r.into for r in g.epilogue[0].stmts[0].refs}
        self.lv = _Levels(g, self.tiles, t, self.taken)
        self.main = {r.into: r for r in parent.refs}

    def tile(self, name: str, idxs: tuple[Index, ...]) -> _Tile:
        vars_ = tuple(ix.name for ix in idxs)
        return _Tile(name, _dense(self.g.dtype, [self.tiles[v] for v in vars_]), vars_)

    def tile_numbers(self, idxs: tuple[Index, ...]) -> tuple[Index, ...]:
        return tuple(Index(ix.name, -(-ix.range // self.tiles[ix.name])) for ix in idxs)

    def edges(self, names) -> list[Affine]:
        """``r - 1 - v >= 0`` for each index ``v`` whose tile does not divide its range ``r``."""
        ranges, tiles = self.ranges, self.tiles
        return [Affine.constant(ranges[v] - 1) - Affine.var(v) for v in names if ranges[v] % tiles[v]]

    def constraints(self, affs: list[Affine], path: str) -> tuple[tuple[Affine, ...], set]:
        """``affs`` in the block at the end of ``path``, and the enclosing levels' indexes they use."""
        out, used = [], set()
        for c in affs:
            got, u = self.lv.whole(c, path)
            out.append(got)
            used |= u
        return tuple(out), used

    def whole_view(
        self, r: Refinement, access: tuple[Affine, ...], level: str, dir_=None, agg=None
    ) -> Refinement:
        """A view of the kernel's ref ``r`` (its buffer whole) offset by ``level``'s share of ``access``."""
        return Refinement(
            dir_ or r.dir,
            r.into,
            tuple(self.lv.part(a, level) for a in access),
            TensorShape(r.shape.dtype, self.main[r.source].shape.dims),
            r.from_ if level == "G" else None,
            r.agg_op if agg is None else agg,
            r.location if level == "G" else None,
            r.is_const,
            r.tags if level == "G" else frozenset(),
        )

    def local_view(self, tile: _Tile, level: str, dir_, agg="", into=None) -> Refinement:
        """A view of a tile allocation: each dim's share at ``level``."""
        lv = self.lv
        acc = tuple(lv.part(Affine.var(v), level) if v in lv.share else Affine.constant(0) for v in tile.vars)
        shape = _scalar(tile.shape) if level in ("F", "R") else tile.shape
        return Refinement(dir_, into or tile.name, acc, shape, tile.name if into else None, agg)

    def allocation(self, tile: _Tile, memory: str, agg: str = "") -> Refinement:
        return Refinement(RefDir.NONE, tile.name, tuple(Affine.constant(0) for _ in tile.vars), tile.shape,
                          location=Location(memory), agg_op=agg)


class _Nest(_Views):
    """One kernel's nest, built from the outside in: the work-group level (``group``) holds the K
    steps (``kstep``), which fill the staged operand tiles (``fills``) and hold the work-items and
    their register blocks that multiply them (``products``); a fused kernel's work-group level ends
    with the work-items that apply its epilogue to the accumulator (``epilogue``)."""

    def __init__(self, kb: Block, parent: Block, g: Gemm, t: GemmTiles, cfg: GemmTileConfig):
        super().__init__(kb, parent, g, t)
        self.cfg, self.t = cfg, t
        # the staged operand tiles A_l (M.., K..) and B_l (K.., N..); the output tile (M.., N..), a
        # fused kernel's accumulator
        self.a_l = self.tile(fresh(f"{g.a.ref.into}_l", self.taken), g.m.idxs + g.k.idxs)
        self.taken.add(self.a_l.name)
        self.b_l = self.tile(fresh(f"{g.b.ref.into}_l", self.taken), g.k.idxs + g.n.idxs)
        self.taken.add(self.b_l.name)
        self.acc = self.tile(g.epilogue[1].into if g.epilogue is not None else "", g.m.idxs + g.n.idxs)
        self.out = self.out_chain()
        self.thread_pieces = self.lv.pieces["t"]
        regs = self.lv.pieces["c"] + self.lv.pieces["q"]
        self.reg_pieces = [p for p in regs if p.var in self.mtiles] + [
            p for p in regs if p.var in self.ntiles
        ]

    def out_chain(self) -> dict[str, Refinement]:
        """The view of the products' output at each level: the kernel's output, or (fused) its
        accumulator, a tile allocated at the work-group level."""
        g = self.g
        if g.epilogue is None:
            out = g.out
            out_leaf = out.leaf or out.ref
            return {
                "G": self.whole_view(out.ref, out.access, "G"),
                "S": self.whole_view(out.ref, out.access, "S", agg="add"),
                "T": self.whole_view(out.ref, out.access, "T", agg="add"),
                "R": replace(self.whole_view(out.ref, out.access, "R", agg="add"), shape=out_leaf.shape),
            }
        kb_, local = g.epilogue
        leaf = next(r for r in kb_.stmts[0].refs if r.source == local.into)
        return {
            "G": self.allocation(self.acc, self.cfg.acc_memory, local.agg_op),
            "S": self.local_view(self.acc, "S", RefDir.OUT, leaf.agg_op),
            "T": self.local_view(self.acc, "T", RefDir.OUT, leaf.agg_op),
            "R": self.local_view(self.acc, "R", RefDir.OUT, leaf.agg_op, into=leaf.into),
        }

    # ------------------------------------------------------------ the levels, outermost first
    def group(self) -> Block:
        """The kernel itself, over the work-group tiles: its K steps, then (fused) its epilogue."""
        g, kb = self.g, self.kb
        refs = [self.whole_view(g.a.ref, g.a.access, "G", dir_=RefDir.IN),
                self.whole_view(g.b.ref, g.b.access, "G", dir_=RefDir.IN), self.out["G"]]
        stmts: list = [self.kstep()]
        if g.epilogue is not None:
            epilogue, erefs = self.epilogue()
            refs += [self.whole_view(r, r.access, "G") for r in erefs]
            stmts.append(epilogue)
        return replace(
            kb,
            idxs=self.tile_numbers(g.batch.idxs + g.m.idxs + g.n.idxs),
            constraints=(),
            refs=tuple(refs),
            stmts=tuple(stmts),
            tags=kb.tags | frozenset(self.cfg.group_set),
            plan=self.plan(refs),
        )

    def plan(self, refs: list[Refinement]) -> GemmPlan:
        """The hand-off to the code generator (``stripe.plans``): the index roles with their tiles,
        the operands' and the output's refinements, the shape, whether an epilogue follows."""
        g, t = self.g, self.t

        def named(grp) -> tuple[tuple[str, int], ...]:
            return tuple((ix.name, self.tiles[ix.name]) for ix in grp.idxs)

        def threads(tiles: dict[str, int]) -> int:
            return math.prod(p.range for p in self.thread_pieces if p.var in tiles)

        a, b, out = (r.into for r in refs[:3])
        # as the nest has them: a tile below the register block (a CPU's 2 rows) is one work-item's
        rm, rn = t.tm // threads(self.mtiles), t.tn // threads(self.ntiles)
        kt = math.prod(self.tiles[ix.name] for ix in g.k.idxs)  # the flat K tile (short K: below t.kt)
        return GemmPlan(named(g.m), named(g.n), named(g.batch), named(g.k), a, b, out,
                        t.tm, t.tn, rm, rn, kt, g.epilogue is not None, t.unit)

    def kstep(self) -> Block:
        """One K step: the staged tiles allocated, filled, then multiplied by the work-items."""
        g = self.g
        fills, fill_used = self.fills()
        thread, mul_used = self.products()
        refs = (
            self.whole_view(g.a.ref, g.a.access, "S", dir_=RefDir.IN),
            self.whole_view(g.b.ref, g.b.access, "S", dir_=RefDir.IN),
            self.out["S"],
            self.allocation(self.a_l, self.cfg.memory),
            self.allocation(self.b_l, self.cfg.memory),
        )
        return Block(
            "",
            self.tile_numbers(g.k.idxs) + self.lv.throughs(fill_used | mul_used, "GS"),
            (),
            refs,
            (*fills, thread),
            frozenset(self.cfg.kstep_set),
        )

    def fills(self) -> tuple[tuple[Block, ...], set[tuple[str, str]]]:
        """A block per operand copying its K step's tile into the staged tile (within its guards and
        the edges), and the enclosing indexes they use."""
        g, lv = self.g, self.lv
        blocks, fill_used = [], set()
        for op, tile in ((g.a, self.a_l), (g.b, self.b_l)):
            c, used = self.constraints(list(op.guards) + self.edges(tile.vars), "GSF")
            fill_used |= used
            src = _scalar((op.leaf or op.ref).shape)
            refs = (
                Refinement(RefDir.IN, op.ref.into, tuple(lv.part(a, "F") for a in op.access), src),
                self.local_view(tile, "F", RefDir.OUT, "assign"),
            )
            idxs = tuple(Index(v, self.tiles[v]) for v in tile.vars) + lv.throughs(used, "GSF")
            stmts = (Load(op.ref.into, "$x"), Store("$x", tile.name))
            blocks.append(Block("", idxs, c, refs, stmts, frozenset(self.cfg.fill_set)))
        return tuple(blocks), fill_used

    def products(self) -> tuple[Block, set[tuple[str, str]]]:
        """The work-items, each with its register blocks running the contraction's own statements
        over the staged tiles, and the enclosing indexes they use."""
        g, lv = self.g, self.lv
        body = self.kb if g.epilogue is None else g.epilogue[0].stmts[0]
        guards = list(dict.fromkeys(g.a.guards + g.b.guards + g.store_guards))
        mkn = [ix.name for ix in g.m.idxs + g.k.idxs + g.n.idxs]
        c_mul, mul_used = self.constraints(guards + self.edges(mkn), "GSTR")
        body_refs = {r.into: r for r in body.refs}
        reg_refs = (
            self.local_view(self.a_l, "R", RefDir.IN, into=(g.a.leaf or g.a.ref).into),
            self.local_view(self.b_l, "R", RefDir.IN, into=(g.b.leaf or g.b.ref).into),
            self.out["R"],
        )
        reg = Block(
            "",
            tuple(Index(ix.name, self.tiles[ix.name]) for ix in g.k.idxs)
            + tuple(Index(p.name, p.range) for p in self.reg_pieces) + lv.throughs(mul_used, "GSTR"),
            c_mul,
            tuple(sorted(reg_refs, key=lambda r: list(body_refs).index(r.into))),
            body.stmts,
            frozenset(self.cfg.reg_set),
        )
        thread = Block(
            "",
            tuple(Index(p.name, p.range) for p in self.thread_pieces) + lv.throughs(mul_used, "GST"),
            (),
            tuple(self.local_view(tile, "T", RefDir.IN) for tile in (self.a_l, self.b_l)) + (self.out["T"],),
            (reg,),
            frozenset(self.cfg.thread_set),
        )
        return thread, mul_used

    def epilogue(self) -> tuple[Block, list[Refinement]]:
        """A fused kernel's work-items applying its epilogue to the accumulator (within the store
        guards and the edges), and the kernel's refs the epilogue uses."""
        assert self.g.epilogue is not None
        kb_, local = self.g.epilogue
        lv = self.lv
        used_names = epilogue_refs(kb_)
        erefs = [r for r in kb_.refs if r.into in used_names and r.into != local.into]
        c_epi, epi_used = self.constraints(list(self.g.store_guards) + self.edges(self.acc.vars), "GTR")
        reg = Block(
            "",
            tuple(Index(p.name, p.range) for p in self.reg_pieces) + lv.throughs(epi_used, "GTR"),
            c_epi,
            tuple(replace(self.whole_view(r, r.access, "R"), shape=r.shape) for r in erefs)
            + (self.local_view(self.acc, "R", RefDir.IN),),
            kb_.stmts[1:],
            frozenset(self.cfg.reg_set),
        )
        thread = Block(
            "",
            tuple(Index(p.name, p.range) for p in self.thread_pieces) + lv.throughs(epi_used, "GT"),
            (),
            tuple(self.whole_view(r, r.access, "T") for r in erefs)
            + (self.local_view(self.acc, "T", RefDir.IN),),
            (reg,),
            frozenset(self.cfg.thread_set),
        )
        return thread, erefs
