"""The launched kernel's facts (``tma``): which GEMMs take it, on which tiles, with what memory.

A device that launches kernels through CUDA's driver gives them more local memory than OpenCL
does (an H100: 227 KiB). The warp-group kernel fed by the tensor memory accelerator then takes
larger tiles: ``tiles`` (``fold_tiles`` for ``3xtf32``, whose kernel keeps a second accumulator)
with K steps of ``k_bytes``, for the precision ``modes`` it launches, ``tm / 16`` warps
multiplying and one loading. These are NVIDIA's facts, not the hardware model's: the ``cuda``
config writes them as the matrix unit's ``backend["launch"]`` (which Stripe carries and never
reads), a device that launches sets ``local_KiB`` there (``with_local``), and ``gemm_tile`` ranks
the launched tiles first through the ranking this module registers with it (``ranking``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from stripe.config import ConfigError
from stripe.gemm import Gemm, streams
from stripe.gemm_model import GemmModel, GemmTiles
from stripe.hardware import MatrixUnit
from stripe.ir import Block
from stripe.passes.gemm_tile import SPLIT_TAG, register_ranking

KEY = "launch"  # the matrix unit's ``backend`` entry


@dataclass(frozen=True)
class Launch:
    """What the launched kernel takes (module docstring); ``local_KiB`` 0: the device does not
    launch it."""

    tiles: tuple[tuple[int, int], ...] = ()
    k_bytes: int = 128
    modes: tuple[str, ...] = ()
    fold_tiles: tuple[tuple[int, int], ...] = ()
    local_KiB: float = 0.0

    def launched(self, mode: str) -> tuple[tuple[int, int], ...]:
        """The launched kernel's tiles for precision ``mode`` (none where it does not launch)."""
        if not self.local_KiB or mode not in self.modes:
            return ()
        return self.fold_tiles if mode == "3xtf32" else self.tiles


def of(unit: MatrixUnit | None) -> Launch | None:
    """The unit's launch facts (None: it has none, or no warp-group products to launch)."""
    raw = unit.backend.get(KEY) if unit is not None else None
    if raw is None or unit.warpgroup is None:
        return None
    if isinstance(raw, Launch):
        return raw
    known = {f.name for f in fields(Launch)}
    if not isinstance(raw, dict) or set(raw) - known:
        extra = sorted(set(raw) - known) if isinstance(raw, dict) else raw
        raise ConfigError(
            f"the matrix unit's backend.{KEY} has unknown keys {extra}",
            None, f"write an object with some of {', '.join(sorted(known))} (backends/cuda/launched.py)",
        )
    pairs = ("tiles", "fold_tiles")
    return Launch(**{k: tuple(tuple(x) for x in v) if k in pairs else tuple(v) if k == "modes" else v
                     for k, v in raw.items()})


def with_local(unit: MatrixUnit, local_KiB: float) -> MatrixUnit:
    """``unit`` on a device that launches its kernels with ``local_KiB`` of local memory (as it is
    where it has no launch facts or ``local_KiB`` is 0)."""
    facts = of(unit)
    if facts is None or not facts.tiles or not local_KiB:
        return unit
    return replace(unit, backend={**unit.backend, KEY: replace(facts, local_KiB=local_KiB)})


def feeds(g: Gemm, tm: int, tn: int, kt: int, size: int) -> bool:
    """Whether the launched kernel's copies feed ``g``'s tiles (``stripe.gemm.streams``): 16-bit
    operands also where the last tiles overhang M, N or K (the tensor memory accelerator fills
    what lies outside with zeros, which add nothing; the stores are guarded); 32-bit ones (B
    K-major, ``backends.cuda.kmajor``'s copies and 3xtf32's split along 3K) in whole tiles."""
    return streams(g, tm, tn, kt, size, b_kmajor=size == 4, whole=size == 4)


def tiles(model: GemmModel, unit: MatrixUnit, name: str, mode: str) -> list[GemmTiles]:
    """The tiles of the launched kernel for the model's GEMM, where the device launches with more
    local memory and its copies feed the GEMM (``feeds``):
    one warp per 16 rows and one loading, within the work-group size, K steps of ``k_bytes``
    (``3xtf32``: ``ranking`` asks only for GEMMs whose operands ``kmajor`` split)."""
    facts = of(unit)
    if facts is None:
        return []
    size = unit.operation(mode).input_bytes
    kt = facts.k_bytes // size
    out = []
    for tm, tn in facts.launched(mode):
        if (tm // 16 + 1) * unit.lanes > model.max_threads:  # the multiplying warps and the loader
            continue
        # (overhanging tiles only where they fill every compute unit: 1000³ keeps 128 work-groups of
        # 128 x 64 rather than 32 launched ones)
        whole = streams(model.g, tm, tn, kt, size, b_kmajor=size == 4)
        if whole or (feeds(model.g, tm, tn, kt, size) and model.groups(tm, tn) >= model.units):
            warps, local = (tm // 16, 1), facts.local_KiB * 1024
            out += model.mma_ranking(unit, name, mode, warps, ((tm, tn),), facts.k_bytes, local)
    return out


def ranking(block: Block, g: Gemm, model: GemmModel, unit: MatrixUnit, name: str,
            mode: str) -> list[GemmTiles]:
    """``gemm_tile``'s tiles ranked before the unit's others: the launched kernel's (a 3xtf32 GEMM
    once its operands are split)."""
    if unit.warpgroup is None or (mode == "3xtf32" and SPLIT_TAG not in block.tags):
        return []
    return tiles(model, unit, name, mode)


register_ranking(ranking)
