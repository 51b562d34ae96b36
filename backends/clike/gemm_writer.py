"""The index arithmetic of a tiled GEMM kernel (``backends.clike.tiled``'s and a vendor's), and
the facts about a GEMM's operands that decide how a kernel stages them.

``Tiles`` is the nest's tiles as ``gemm_tile`` planned them (``stripe.gemm_nest``); ``int_type``
the integer type the kernel's index expressions fit; ``k_fastest`` whether an operand's K
elements are its closest in memory; ``flagged`` whether its guards skip points of its own M (N)
indexes. ``GemmWriter`` writes the lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.clike.target import CTarget
from stripe.gemm import Gemm, Group, Operand
from stripe.gemm_nest import Nest
from tile.affine import Affine

INT32_SAFE = (1 << 31) - (1 << 22)


@dataclass(frozen=True)
class Tiles:
    """Work-group tile ``tm x tn``, register block ``rm x rn`` per work-item, K step ``kt`` (flat),
    and ``per``: each index's tile (index name -> points), as the ``gemm_tile`` nest has them."""

    tm: int
    tn: int
    rm: int
    rn: int
    kt: int
    per: dict[str, int]

    @staticmethod
    def of(nest: Nest) -> Tiles:
        s = nest.shape
        return Tiles(s.tm, s.tn, s.rm, s.rn, s.kt, dict(nest.tiles))

    @property
    def threads(self) -> int:
        return (self.tm // self.rm) * (self.tn // self.rn)

    @property
    def suffix(self) -> str:
        """What the kernel's name adds (``backends.naming`` names it before the tiles are read):
        ``t128x128r8x8k8``, the work-group tile, the register block and the K step."""
        return f"t{self.tm}x{self.tn}r{self.rm}x{self.rn}k{self.kt}"


def count(grp: Group, per: dict[str, int]) -> int:
    """How many tiles cover ``grp``: the product of each index's tile count."""
    out = 1
    for ix in grp.idxs:
        out *= -(-ix.range // per[ix.name])
    return out


def _span(aff: Affine, g: Gemm, ranges: dict[str, int]) -> int:
    """The largest absolute value ``aff`` takes over the block's index box."""
    hi = abs(int(aff.const))
    for v, c in aff.terms:
        s = g.starts[v]
        hi += max(abs(int(c) * s), abs(int(c) * (s + ranges[v] - 1)))
    return hi


def int_type(g: Gemm, tiles: Tiles, threads: int) -> str:
    """``int`` where every index expression of the kernel (``threads`` work-items a work-group)
    stays below 2^31 with room to spare, else ``long``."""
    ranges = {ix.name: ix.range for grp in (g.m, g.n, g.k, g.batch) for ix in grp.idxs}
    # rows past M (columns past N, K past its end) compute addresses they never load: widen
    # every range by a tile so that those stay in range of the integer type too
    wide = {v: -(-r // tiles.per[v]) * tiles.per[v] + tiles.per[v] for v, r in ranges.items()}
    spans = [_span(o.offset, g, wide) for o in (g.a, g.b, g.out) if o is not None]
    totals = [count(g.m, tiles.per) * count(g.n, tiles.per) * g.batch.total, 2 * count(g.k, tiles.per)]
    totals += [(tiles.tm + tiles.tn) * tiles.kt + threads, *wide.values()]
    return "int" if max(spans + totals) < INT32_SAFE else "long"


def k_fastest(g: Gemm, op: Operand, grp: Group) -> bool:
    """Whether the operand's K elements are closer together in memory than its M (N) ones."""

    def stride(names) -> int:
        s = [abs(int(op.offset.coeff(n))) for n in names if op.offset.coeff(n) != 0]
        return min(s) if s else 1 << 62

    return stride([ix.name for ix in g.k.idxs]) <= stride([ix.name for ix in grp.idxs])


def flagged(op: Operand, grp: Group) -> bool:
    """Whether a guard of ``op`` uses its own group (M or N): a point it skips is then a zero
    of ``op`` times a loaded value of the other operand, which is NaN when that value is
    infinite or NaN, so the skip travels as a flag beside the value (``Am``/``Bs`` below).
    A guard on K (and batch) alone zeroes both operands, and ``0 * 0`` adds nothing."""
    return any(set(c.vars) & grp.names for c in op.guards)


class GemmWriter:
    """Writes a tiled GEMM kernel's lines (``line``) and the index arithmetic every tiled kernel
    shares: each index of a group at a flat position (``decompose``), the guards of tiles that
    overhang (``inside``), affine offsets and conditions as C, each operand element's fixed part
    of its address outside the K loop (``operand_plan``) and its load's address and guards
    (``element``). The SIMT kernel (``tiled.GemmEmitter``) and a vendor's renderers write with it."""

    def __init__(self, t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, int_type: str, epilogue=None):
        """``epilogue(lines, vals, acc, depth)`` appends the code that finishes one output element of
        a fused kernel (``vals``: index name -> variable, ``acc``: the sum's register); ``int_type``
        the C type of index arithmetic (``int_type``)."""
        self.t, self.g, self.ptrs, self.tl = t, g, ptrs, tiles
        self.epilogue = epilogue
        self.lines: list[str] = []
        self.int = int_type
        self.T = t.reg(g.dtype)

    def line(self, text: str, depth: int = 1) -> None:
        self.lines.append("    " * depth + text)

    # --------------------------------------------------------------- helpers
    def decompose(
        self, grp: Group, flat: str, prefix: str, depth: int, sizes: dict[str, int] | None = None,
        scale: dict[str, int] | None = None, declare: bool = True,
    ) -> dict[str, str]:
        """Variables holding each index of ``grp`` at flattened position ``flat`` of the box of
        ``sizes`` (default: the ranges), each times ``scale`` (a tile number to its origin);
        ``declare=False`` assigns variables declared before."""
        out: dict[str, str] = {}
        inner = 1
        for k, ix in enumerate(reversed(grp.idxs)):
            size = sizes[ix.name] if sizes is not None else ix.range
            outermost = k == len(grp.idxs) - 1
            at = flat if inner == 1 else f"({flat} / {inner})"
            if not outermost:
                at = f"({at} % {size})"
            if scale is not None and scale[ix.name] != 1:
                at = f"{at} * {scale[ix.name]}"
            var = f"{prefix}_{ix.name}"
            self.line(f"{f'const {self.int} ' if declare else ''}{var} = {at};", depth)
            out[ix.name] = var
            inner *= size
        return out

    def counts(self, grp: Group) -> dict[str, int]:
        return {ix.name: -(-ix.range // self.tl.per[ix.name]) for ix in grp.idxs}

    def inside(self, grp: Group, vals: dict[str, str]) -> list[str]:
        """Guards keeping each index of a tile that may overhang its range inside it."""
        per = self.tl.per
        return [f"{vals[ix.name]} < {ix.range}" for ix in grp.idxs if ix.range % per[ix.name]]

    def affine(self, aff: Affine, vals: dict[str, str], only: frozenset[str] | None = None) -> str:
        """``aff`` restricted to the variables in ``only`` (all when None; the constant with all)."""
        parts = [str(int(aff.const))] if aff.const and only is None else []
        for v, c in aff.terms:
            if only is not None and v not in only:
                continue
            c = int(c)
            parts.append(vals[v] if c == 1 else f"{c} * {vals[v]}")
        return "(" + " + ".join(parts) + ")" if parts else "0"

    def cond(self, affs: tuple[Affine, ...] | list[Affine], vals: dict[str, str]) -> list[str]:
        return [f"{self.affine(c, vals)} >= 0" for c in affs]

    # ---------------------------------------------------------------- loads
    def operand_plan(self, op: Operand, grp: Group, tile: int, side: str, origin: dict[str, str], batch,
                     kfast: bool, w: int):
        """Per loaded element (or vector of ``w``) ``r``: the fixed part of its address and guard
        and its K position in the tile, outside the K loop, and where it goes in the ``__local``
        tile (``kfast``: rows along K). Elements past the tile (when the work-items do not divide it)
        load nothing."""
        g, tl = self.g, self.tl
        size = tile * tl.kt // w  # loads (of w elements) per K tile
        per = -(-size // tl.threads)
        row = tile + (4 if kfast else 0)
        items = []
        for r in range(per):
            e = f"(lid + {r * tl.threads})"
            if kfast:
                mm, kk = f"({e} / {tl.kt // w})", f"({e} % {tl.kt // w})"
                kk = f"{kk} * {w}" if w > 1 else kk
            else:
                mm, kk = f"({e} % {tile // w})", f"({e} / {tile // w})"
                mm = f"({mm} * {w})" if w > 1 else mm
            p = f"{side}{r}"
            self.line(f"const {self.int} {p}_kk = {kk};")
            self.line(f"const {self.int} {p}_mm = {mm};")
            local = self.decompose(grp, f"{p}_mm", f"{p}l", 1, self.tl.per)
            vals = dict(batch)
            for v, var in local.items():
                self.line(f"const {self.int} {p}_{v} = {origin[v]} + {var};")
                vals[v] = f"{p}_{v}"
            kvals = self.decompose(g.k, f"{p}_kk", f"{p}k", 1, self.tl.per)
            fixed = grp.names | g.batch.names
            base = self.affine(op.offset, vals, fixed)
            self.line(f"const {self.int} {p}_base = {base} + {int(op.offset.const)};")
            ok = self.inside(grp, vals) + ([f"{e} < {size}"] if (r + 1) * tl.threads > size else [])
            self.line(f"const bool {p}_ok = {' && '.join(ok) or 'true'};")
            live = f"{e} < {size}" if (r + 1) * tl.threads > size else ""
            items.append((p, vals, kvals, f"{p}_kk * {row} + {p}_mm", live))
        return items, kfast, w

    def element(self, op: Operand, p: str, vals: dict[str, str], kvals: dict[str, str], depth: int):
        """Opens the block of element ``p``'s load for the K tile at the origins ``ko_*`` (its K
        indexes declared there; the caller closes it) and returns what keeps the element (the
        guards, joined) and its address."""
        g = self.g
        ks = ", ".join(f"{p}g_{k} = ko_{k} + {v}" for k, v in kvals.items())
        self.line(f"{{ const {self.int} {ks};" if kvals else "{", depth)
        env = {**vals, **{k: f"{p}g_{k}" for k in kvals}}
        conds = [f"{p}_ok"] + self.inside(g.k, env) + self.cond(op.guards, env)
        return " && ".join(conds), f"{p}_base + {self.affine(op.offset, env, g.k.names)}"

    def k_origins(self, step: str, depth: int) -> None:
        """``ko_*``: each K index's origin in K step ``step`` (its tile number times its tile)."""
        self.decompose(self.g.k, step, "ko", depth, self.counts(self.g.k), self.tl.per, declare=False)


    def at(self, grp: Group, local: str, origin: dict[str, str]) -> dict[str, str]:
        """Each index of ``grp`` at position ``local`` of the work-group's tile (origin + offset)."""
        out = {}
        for v, var in self.decompose(grp, local, local, 1, self.tl.per).items():
            self.line(f"const {self.int} {var}g = {origin[v]} + {var};")
            out[v] = f"{var}g"
        return out
