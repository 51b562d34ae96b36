"""The settings ``tile.compile`` accepts, so that a misspelt one is an error, not silently ignored.

A setting nobody reads would leave a user believing they asked for something (``"stirct": True``
and results that are not bit-identical). ``check`` refuses any name not listed here, suggesting
the nearest known one. Each entry names where the setting is read; the values are checked there,
except ``precision``'s, checked here (``tile.precision.PRECISIONS``) for every target alike.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from tile.errors import TileError
from tile.precision import PRECISIONS

KNOWN: dict[str, str] = {
    # every target (tile.api, backends.runner, backends.tune)
    "cache": "False bypasses the kernel cache",
    "config": "an optimizer config: a file or a built-in config's name",
    "strict": "True: no pass or kernel reorders aggregation (bit-identical to the interpreter)",
    "optimize": "False compiles the lowered program as it is",
    "max_buffer_bytes": "a lower limit for any one buffer",
    "max_total_bytes": "a lower limit for all buffers together",
    "resident_outputs": "True returns outputs as tile.Tensor left on the device",
    "tune": "True times the cost model's best candidates on the device and keeps the fastest",
    "tune_candidates": "how many candidates tuning times (default 4)",
    "tune_refresh": "True tunes again instead of reading the tuning cache",
    "precision": "native, float64 or exact (the interpreter's arithmetic); tf32 or 3xtf32: float32 "
    "matrix products may round operands to TF32 (or split them in two), docs/semantics.md 8.1",
    "tiled": "False leaves out the GEMM tiling (gemm_tile steps, OpenCL work-group kernels)",
    # the LLVM CPU backend (backends.llvm)
    "threads": "how many threads a kernel uses (default: TILE_NUM_THREADS or every core)",
    "opt": "LLVM's optimisation level (0-3, default 3)",
    "unroll": "whether LLVM unrolls loops (default: at opt 2 and above)",
    "generic": "True: kernels read their extents at run time, one build per bucket (backends.llvm.generic)",
    "generic_products": "True (with generic): products as plain loops, not micro-kernels (with tiled=False)",
    "reorder": "False keeps the plain loops' order of float sums (no reassociation)",
    "parallel": "False runs every kernel on one thread",
    "inline": "False calls each kernel's body instead of inlining it",
    "min_parallel_points": "kernels with fewer points run whole (default 16384)",
    "microkernel": "False turns the register-blocked micro-kernel off",
    "panel_split": "False splits a micro-kernel's work over rows, not B's panels",
    "cache_blocks": "False turns the micro-kernel's cache blocking off",
    "sum_block": "points per fresh partial of a long float + reduction (default 4096; 0: one running sum)",
    "cache_bytes": "cache sizes by level name ({'L1': bytes, 'L2': bytes}) for cache blocking",
    "soft_half": "True converts float16 in software even where the CPU has F16C",
    # the OpenCL backend (backends.opencl)
    "fast_math": "True builds with -cl-fast-relaxed-math",
    "local_size": "the work-group size of the general (untiled) kernels (default 64)",
    "async": "False builds OpenCL programs before compile returns",
    # (what the driver knows and no user sets, the matrix units and buffers' storage types, reaches
    # compilers as backends.options.BuildFacts, not as settings)
}


class TileSettingsError(TileError):
    """A settings mapping names a setting no part of Tile reads."""

    kind = "settings error"


def check(settings: Mapping | None) -> None:
    """Raise ``TileSettingsError`` for settings that are not a mapping (``settings="strict"``
    would otherwise be read letter by letter), then for the first name not in ``KNOWN``."""
    if settings is not None and not isinstance(settings, Mapping):
        raise TileSettingsError(
            f"settings must be a dict of setting names to values, not {type(settings).__name__} "
            f"{settings!r}"[:200],
            None,
            _example(settings) + "; the settings are: " + ", ".join(sorted(KNOWN)),
        )
    for name in settings or {}:
        if name in KNOWN:
            continue
        near = difflib.get_close_matches(str(name), KNOWN, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise TileSettingsError(
            f"unknown setting '{name}'",
            None,
            hint + "the settings are: " + ", ".join(sorted(KNOWN)),
        )
    if settings and "precision" in settings and settings["precision"] not in PRECISIONS:
        near = difflib.get_close_matches(str(settings["precision"]), PRECISIONS, n=1)
        raise TileSettingsError(
            f"unknown precision {settings['precision']!r}",
            None,
            (f"did you mean '{near[0]}'? " if near else "") + "the precisions are: " + ", ".join(PRECISIONS),
        )


def _example(settings: object) -> str:
    """``write settings={"strict": True}``, with the setting the value names where it names one."""
    if isinstance(settings, str):
        settings = [settings]
    named = settings if isinstance(settings, list | tuple | set) else []
    names = [n for n in named if isinstance(n, str) and n in KNOWN] or ["strict"]
    return "write settings={" + ", ".join(f'"{n}": True' for n in names) + "}"
