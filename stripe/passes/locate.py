"""``locate_block`` and ``locate_memory``: say where blocks run and where buffers live.

Neither changes what a program computes: a ``Location`` is a placement hint that the schedule,
placement and cost model read (``CONV``, ``DSP``, ``SRAM[0]``) and that executors ignore.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, Location
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite


@dataclass(frozen=True)
class LocSpec:
    name: str
    units: tuple[int, ...] = ()

    def location(self) -> Location:
        from tile.affine import Affine

        return Location(self.name, tuple(Affine.constant(u) for u in self.units))


@dataclass(frozen=True)
class LocateBlockConfig:
    reqs: tuple[str, ...]
    loc: LocSpec


@dataclass(frozen=True)
class LocateMemoryConfig:
    reqs: tuple[str, ...]
    loc: LocSpec
    ref_tags: tuple[str, ...] = ()  # only refinements carrying these tags (empty: all)


@register("locate_block", LocateBlockConfig)
def locate_block(program: Block, cfg: LocateBlockConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs``; sets their ``location`` to ``loc``. Guarantees:
    nothing else changes."""
    return rewrite(program, lambda b, ctx: replace(b, location=cfg.loc.location()), cfg.reqs, nested=True)


@register("locate_memory", LocateMemoryConfig)
def locate_memory(program: Block, cfg: LocateMemoryConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs``; sets the ``location`` of their refinements that
    carry every tag in ``ref_tags`` to ``loc``. Guarantees: nothing else changes."""
    loc = cfg.loc.location()

    def fn(b: Block, ctx: Context) -> Block:
        refs = tuple(
            replace(r, location=loc) if all(t in r.tags for t in cfg.ref_tags) else r for r in b.refs
        )
        return replace(b, refs=refs)

    return rewrite(program, fn, cfg.reqs, nested=True)
