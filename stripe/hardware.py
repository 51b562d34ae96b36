"""The hardware model of a target, as the Stripe seed describes it: memories, execution units,
transfer units and the buses between them, and fixed-function matrix units with their operations'
shapes, types and fragment layouts (how a backend issues them is the backend's). Passes read
sizes from it (a tile must fit ``mem_units[memory]``), the cost model reads speeds
(``clock_mhz``, ``ops_per_cycle``, ``bytes_per_cycle``). It is plain data, loaded from a target's
config by ``stripe.config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MemUnit:
    """``count`` memories of ``size_KiB`` each; ``line_bytes`` is the width of one transfer (a cache
    line, a DMA burst), the granularity the cost model counts traffic in."""

    size_KiB: float
    count: int = 1
    line_bytes: int = 64


@dataclass(frozen=True)
class ExecUnit:
    """``count`` units doing ``ops_per_cycle`` each; ``threads`` is how many hardware threads (GPU
    work-items of one work-group, CPU threads) one unit runs at once."""

    count: int = 1
    ops_per_cycle: int = 1
    pipeline_depth: int = 1
    threads: int = 1


@dataclass(frozen=True)
class TxUnit:
    count: int = 1


@dataclass(frozen=True)
class Bus:
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    bytes_per_cycle: float


@dataclass(frozen=True)
class Fragment:
    """Where one lane's elements of a matrix unit's operand (or accumulator) sit, as a stencil:
    lane ``l`` is ``g = l // group``, ``t = l % group`` (``MatrixUnit.group``); its ``e``-th
    element (registers in order, ``per_register`` elements packed in each, lowest bits first) is
    at row ``rows[0]·g + rows[1]·t + elements[e][0]`` and column ``cols[0]·g + cols[1]·t +
    elements[e][1]`` of the operand's ``m x k`` (A), ``k x n`` (B) or ``m x n`` (C) tile."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    elements: tuple[tuple[int, int], ...]
    per_register: int = 1

    def at(self, lane_g: int, lane_t: int, e: int) -> tuple[int, int]:
        r, c = self.elements[e]
        row = self.rows[0] * lane_g + self.rows[1] * lane_t + r
        return row, self.cols[0] * lane_g + self.cols[1] * lane_t + c


@dataclass(frozen=True)
class MmaShape:
    """One fixed operation of a matrix unit: ``C[m, n] += A[m, k] · B[k, n]`` over ``lanes`` lanes
    working together, operands of ``inputs`` (``float16``, ``bfloat16`` or ``tf32``: float32
    rounded to 10 mantissa bits), the sum kept in ``accumulator``; ``a``, ``b``, ``c`` the fragment
    layouts. The instruction that issues it is the backend's to name, from these."""

    m: int
    n: int
    k: int
    inputs: str
    accumulator: str
    a: Fragment
    b: Fragment
    c: Fragment

    @property
    def input_bytes(self) -> int:
        """Bytes of one operand element in memory (TF32 operands are float32)."""
        return 2 if self.inputs in ("float16", "bfloat16") else 4


@dataclass(frozen=True)
class WarpGroup:
    """A matrix unit's asynchronous warp-group products: the ``warps`` warps of a work-group tile
    (one of ``tiles``, M x N) issue, four warps together, one ``m64 x n x k16`` product per K slice
    of 16, both operands read from ``__local`` tiles, the sums in registers laid out per 8 columns
    as the unit's accumulator fragment. For precision ``modes`` only, with a K step of
    ``k_bytes``. A device has them only at exactly ``capability`` (they do not carry over to later
    devices)."""

    modes: tuple[str, ...]
    capability: tuple[int, int]
    tiles: tuple[tuple[int, int], ...] = ((128, 128), (128, 64))
    warps: tuple[int, int] = (8, 1)
    k_bytes: int = 64

    def sides(self, n: int) -> tuple[tuple[int, int], ...]:
        """The work-group tiles for ``n`` columns: those no wider than ``n`` rounded up to 64 (a
        64-column convolution takes 128 x 64, not half an empty 128 x 128), else all."""
        fit = tuple(t for t in self.tiles if t[1] <= -(-n // 64) * 64)
        return fit or self.tiles


@dataclass(frozen=True)
class MatrixUnit:
    """A fixed-function matrix unit: its operations by precision mode (``f16``,
    ``bf16``, ``tf32``), ``lanes`` work-items issuing each one together, ``group`` lanes sharing
    a fragment row. ``vendor`` and ``min_capability`` say which devices have it: a device keeps
    the unit in its hardware model only when it reports that vendor and at least that compute
    capability (``Device.hardware``). ``warpgroup``: its warp-group products, where it has them.
    ``backend``: what the unit's backend keeps about its own kernels (the tiles and memory of the
    kernels it launches its own way, say), carried with the model and never read by Stripe."""

    shapes: dict[str, MmaShape]
    lanes: int = 32
    group: int = 4
    vendor: str = ""
    min_capability: tuple[int, int] = (0, 0)
    warpgroup: WarpGroup | None = None
    backend: dict[str, Any] = field(default_factory=dict)

    def operation(self, mode: str) -> MmaShape | None:
        """The operation precision ``mode`` issues (``3xtf32`` issues ``tf32`` ones), or None."""
        return self.shapes.get("tf32" if mode == "3xtf32" else mode)


@dataclass(frozen=True)
class Hardware:
    clock_mhz: float
    mem_units: dict[str, MemUnit]
    exec_units: dict[str, ExecUnit]
    tx_units: dict[str, TxUnit] = field(default_factory=dict)
    buses: tuple[Bus, ...] = ()
    matrix_units: dict[str, MatrixUnit] = field(default_factory=dict)

    def memory(self, name: str) -> MemUnit:
        """The memory unit ``name`` (a ``KeyError`` means a config check was missed)."""
        return self.mem_units[name]

    def mem_bytes(self, name: str) -> int:
        """The size of one ``name`` memory in bytes."""
        return int(self.mem_units[name].size_KiB * 1024)

    def bandwidth(self, source: str, sink: str) -> float | None:
        """Bytes per cycle of the fastest bus from a unit named ``source`` to one named ``sink``
        (names without ``[i]``); None when no bus connects them."""
        best = None
        for b in self.buses:
            if any(_unit(s) == source for s in b.sources) and any(_unit(s) == sink for s in b.sinks):
                best = b.bytes_per_cycle if best is None else max(best, b.bytes_per_cycle)
        return best

    def peak_ops_per_cycle(self) -> int:
        return sum(u.count * u.ops_per_cycle for u in self.exec_units.values())


def _unit(name: str) -> str:
    return name.split("[", 1)[0]
