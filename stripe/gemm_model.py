"""The cost model of ``gemm_tile``: which tiles a GEMM-shaped contraction (``stripe.gemm.Gemm``)
gets on a hardware config, and how they spread over its Stripe indexes.

``GemmTiles`` is one choice (work-group tile, register block, K step); ``GemmModel`` ranks the
valid choices for the pass's ``model`` (``gpu``: the rule measured best on an H100, then every
other valid choice by an estimate; ``cpu``: cache tiles from L1/L2); ``index_tiles`` and
``k_tiles`` turn a flat tile into per-index tiles (powers of two padding the fewest points; K
tiles that keep Stripe's order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import product
from typing import Protocol

from stripe.gemm import Gemm
from stripe.hardware import Hardware, MatrixUnit
from stripe.ir import Index
from tile.dtypes import DType


class GemmChoices(Protocol):
    """The params of a config the model reads (``gemm_tile``'s config has them): the memories the
    operand tiles and a fused accumulator live in, the candidate work-group ``sides``, register
    blocks and K steps, the ``model`` (``gpu`` or ``cpu``) and the CPU code generator's ``panel``."""

    memory: str
    acc_memory: str
    sides: tuple[int, ...]
    registers: tuple[int, ...]
    k_steps: tuple[int, ...]
    model: str
    panel: tuple[int, int]


@dataclass(frozen=True)
class GemmTiles:
    """Work-group tile ``tm x tn``, register block ``rm x rn``, K step ``kt``; ``cost``: the model's
    estimate (lower is better; 0 for the rule's choice, which ranks first)."""

    tm: int
    tn: int
    rm: int
    rn: int
    kt: int
    cost: float = 0.0
    unit: str = ""  # on a matrix unit: ``unit.mode`` (a work-item of the nest is then a warp)

    @property
    def tiles(self) -> tuple[int, ...]:
        return (self.tm, self.tn, self.rm, self.rn, self.kt)

    @property
    def threads(self) -> int:
        return (self.tm // self.rm) * (self.tn // self.rn)

    @property
    def suffix(self) -> str:
        """What a kernel's name adds: ``t128x128r8x8k8`` (on a matrix unit, its mode after it:
        ``t128x128r64x32k32f16``)."""
        mode = self.unit.rsplit(".", 1)[-1] if self.unit else ""
        return f"t{self.tm}x{self.tn}r{self.rm}x{self.rn}k{self.kt}{mode}"


# ------------------------------------------------------------------------------ the cost model
class GemmModel:
    """The tiles of one GEMM (``stripe.gemm.Gemm``) on ``hw``: ``rule()`` is the choice measured
    best on an H100 (bench/RESULTS.md), restated over the hardware: the largest side (128, 64, 32
    of ``sides``) that M and N fill, 8x8 registers per work-item at 128 and 4 below; unequal sides
    with a 128 halve it (8x4 blocks of 256 work-items spill); a 128 side halves while there are
    fewer work-groups than compute units; the K step is the largest of ``k_steps`` whose operands
    and accumulators (``rm·rn·kt`` values) fit twice the register memory (8 at 8x8 in float32: at
    16 an H100 keeps one work-group per SM). ``ranking()`` puts it first, then every other valid
    choice by ``estimate`` (waves of work-groups times each one's multiply-adds and local reads).
    A choice is valid when its work-items (``tm/rm · tn/rn``) fit a unit's ``threads``, divide
    the staged tiles, and the two double-buffered tiles fit ``memory``."""

    def __init__(self, g: Gemm, hw: Hardware, cfg: GemmChoices):
        self.g, self.hw, self.cfg = g, hw, cfg
        units = list(hw.exec_units.values())
        self.units = sum(u.count for u in units) or 1
        self.max_threads = max((u.threads for u in units), default=1)
        self.local_bytes = hw.mem_units[cfg.memory].size_KiB * 1024
        reg = hw.mem_units.get(cfg.acc_memory)
        self.reg_bytes = (reg.size_KiB * 1024) if reg is not None else 1024
        self.bytes = 8 if g.dtype is DType.FLOAT64 else 4

    def groups(self, tm: int, tn: int) -> int:
        return -(-self.g.m.total // tm) * -(-self.g.n.total // tn) * self.g.batch.total

    def valid(self, t: GemmTiles) -> bool:
        if t.rm % 4 or t.rn % 4 or t.tm % t.rm or t.tn % t.rn or not 1 <= t.threads <= self.max_threads:
            return False
        if (t.tm * t.kt) % t.threads or (t.tn * t.kt) % t.threads:
            return False
        return 2 * t.kt * (t.tm + t.tn + 8) * self.bytes <= self.local_bytes

    def k_step(self, rm: int, rn: int) -> int:
        fits = [k for k in self.cfg.k_steps if rm * rn * k * self.bytes <= 2 * self.reg_bytes]
        return max(fits) if fits else min(self.cfg.k_steps)

    def rule(self) -> GemmTiles:
        sides = sorted(self.cfg.sides, reverse=True)
        regs = sorted(self.cfg.registers, reverse=True)

        def side(total: int) -> tuple[int, int]:
            for k, s in enumerate(sides):
                if total >= s or k == len(sides) - 1:
                    return s, regs[0] if k == 0 else regs[-1]
            raise AssertionError

        (tm, rm), (tn, rn) = side(self.g.m.total), side(self.g.n.total)
        top, half = sides[0], sides[min(1, len(sides) - 1)]
        if tm == top and tn == half:  # 8x4 blocks over 256 work-items spill: one group per SM
            tm = half
        while self.groups(tm, tn) < self.units and max(tm, tn) == top and half < top:
            if tm >= tn:
                tm, rm = half, regs[-1]
            else:
                tn, rn = half, regs[-1]
        return GemmTiles(tm, tn, rm, rn, self.k_step(rm, rn))

    def estimate(self, t: GemmTiles) -> float:
        per_unit = max(1, min(self.max_threads // t.threads, int(self.local_bytes // self.staged(t))))
        waves = -(-self.groups(t.tm, t.tn) // (self.units * per_unit))
        steps = -(-self.g.k.total // t.kt)
        return float(waves * steps * t.kt * (t.rm * t.rn + t.rm + t.rn))

    def staged(self, t: GemmTiles) -> int:
        return 2 * t.kt * (t.tm + t.tn + 8) * self.bytes

    def mma_ranking(
        self, unit: MatrixUnit, name: str, mode: str, warps: tuple[int, int],
        sides: tuple[tuple[int, int], ...], k_bytes: int = 32, local_bytes: float | None = None,
    ) -> list[GemmTiles]:
        """Tiles around the matrix unit's operation for precision ``mode`` (``name``: what the plan
        calls it): ``warps`` warps per work-group, each a register block (``rm x rn``: its share of
        the tile, a whole number of the unit's ``m x n``); a K step of ``k_bytes`` (32: 16 16-bit or 8
        32-bit values; the code generator keeps up to four K steps in flight); the largest work-group tile
        of ``sides`` that still gives every compute unit a work-group, else the one giving most.
        Valid when the double-buffered tiles (rows padded by 8) fit ``memory``, the warps fit a
        unit's threads, and the K tile is a whole number of the operation's ``k``. Empty when no
        choice is valid (the kernel then takes the SIMT tiles). ``local_bytes``: the local memory
        a work-group has when not ``memory``'s (a kernel launched with more)."""
        op = unit.operation(mode)
        local = self.local_bytes if local_bytes is None else local_bytes
        if op is None:
            return []
        size = op.input_bytes
        kt = k_bytes // size
        wm, wn = warps
        out = []
        for tm, tn in sides:
            rm, rn = tm // wm, tn // wn
            if rm % op.m or rn % op.n or wm * wn * unit.lanes > self.max_threads:
                continue
            if 2 * (tm + tn) * (kt + 16 // size) * size > local:
                continue
            if math.prod(k_tiles(self.g.k.idxs, kt).values()) % op.k:
                continue
            out.append(GemmTiles(tm, tn, rm, rn, kt, unit=name))  # ordered below, not by cost
        full = [t for t in out if self.groups(t.tm, t.tn) >= self.units]
        # the largest tiles that still give every compute unit a work-group, else the most groups
        return sorted(full, key=lambda t: -t.tm * t.tn) + sorted(
            [t for t in out if t not in full], key=lambda t: (-self.groups(t.tm, t.tn), -t.tm * t.tn)
        )

    def cpu_rule(self) -> GemmTiles:
        """``model: cpu``, the only choice: a K tile of ``kt`` points (a multiple of 64) so that
        ``MR`` rows of A fill a quarter of ``L1``; an N tile (a power of two, at least ``NR``) so
        that the ``kt x tn`` block of B fills half of ``L2``; M whole (the rows stream past the
        block); register blocks 4 x 4 (the nest's work-item layout is a GPU's: a CPU code generator
        reads the tiles back, ``stripe.gemm_nest``, and blocks registers itself)."""
        mr, nr = self.cfg.panel
        l1, l2 = (self.hw.mem_bytes(m) for m in ("L1", "L2"))
        kt = max(64, int(l1 // (4 * mr * self.bytes)) // 64 * 64)
        tn = max(nr, 1 << (max(1, int(l2 // 2 // (kt * self.bytes))).bit_length() - 1))
        while tn > nr and tn >= 2 * self.g.n.total:
            tn //= 2
        return GemmTiles(1 << (self.g.m.total - 1).bit_length(), tn, 4, 4, kt)

    def ranking(self) -> list[GemmTiles]:
        if self.cfg.model == "cpu":
            return [self.cpu_rule()]
        first = self.rule()
        out = [first] if self.valid(first) else []
        for tm, tn, rm, rn, kt in product(self.cfg.sides, self.cfg.sides, self.cfg.registers,
                                          self.cfg.registers, self.cfg.k_steps):
            t = GemmTiles(tm, tn, rm, rn, kt)
            if t.tiles != first.tiles and self.valid(t):
                out.append(replace(t, cost=self.estimate(t)))
        return out[:1] + sorted(out[1:], key=lambda t: (t.cost, t.tiles)) if out else []


def index_tiles(idxs: tuple[Index, ...], total: int) -> dict[str, int]:
    """Power-of-two tiles of ``idxs`` whose product is ``total`` (a power of two), padding the
    fewest points; ties give the larger tiles to the faster (later) indexes."""
    def spread(bits: int, n: int):  # the ways to share ``bits`` among ``n`` indexes
        if n == 1:
            yield (bits,)
            return
        for e in range(bits + 1):
            for rest in spread(bits - e, n - 1):
                yield (e, *rest)

    best, key = None, None
    for exps in spread(total.bit_length() - 1, len(idxs)):
        padded = math.prod(-(-ix.range // (1 << e)) * (1 << e) for ix, e in zip(idxs, exps))
        k = (padded, tuple(-e for e in reversed(exps)))
        if key is None or k < key:
            best, key = exps, k
    assert best is not None
    return {ix.name: 1 << e for ix, e in zip(idxs, best)}


def k_tiles(idxs: tuple[Index, ...], kt: int) -> dict[str, int]:
    """K tiles of about ``kt`` points that keep Stripe's order: the last indexes whole while they
    fit, the next one the rest (at least 1), the earlier ones 1."""
    out, size = {ix.name: 1 for ix in idxs}, 1
    for ix in reversed(idxs):
        if size * ix.range <= kt:
            out[ix.name], size = ix.range, size * ix.range
            continue
        out[ix.name] = max(1, kt // size)
        break
    return out
