"""The hardware model of a target, as the Stripe seed describes it: memories, execution units,
transfer units and the buses between them. Passes read sizes from it (a tile must fit
``mem_units[memory]``), the cost model reads speeds (``clock_mhz``, ``ops_per_cycle``,
``bytes_per_cycle``). It is plain data, loaded from a target's config by ``stripe.config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
class Hardware:
    clock_mhz: float
    mem_units: dict[str, MemUnit]
    exec_units: dict[str, ExecUnit]
    tx_units: dict[str, TxUnit] = field(default_factory=dict)
    buses: tuple[Bus, ...] = ()

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
