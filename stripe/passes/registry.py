"""The pass registry: a target config names passes by these names.

A pass is a pure function ``fn(program: Block, cfg: <Config>, hw: Hardware) -> Block`` taking and
returning the whole ``#program`` tree, with a frozen-dataclass config whose fields are the
``params`` a config file may give (``stripe.config`` checks names and types against it).
``reorders`` says whether the pass may change the order in which one element's aggregation
receives its values (splitting a reduction index does); ``settings={"strict": True}`` skips such
passes so compiled results stay bit-identical to the interpreter's order. ``kernel_tiling`` marks
a pass that tiles kernels for the code generator's tiled emitters (``settings={"tiled": False}``
leaves such steps out). ``sites``, where a pass chooses among ranked candidates, is
``sites(program, cfg, hw) -> {block name: ranking}``: the blocks it would tile and what its config's
``choices`` (block name -> rank) select from, which the autotuner times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable[[Block, object, Hardware], Block]
    config: type
    reorders: bool = False
    kernel_tiling: bool = False
    sites: Callable[[Block, object, Hardware], dict[str, list]] | None = None


PASSES: dict[str, PassInfo] = {}


def register(
    name: str,
    config: type,
    *,
    reorders: bool = False,
    kernel_tiling: bool = False,
    sites: Callable[[Block, object, Hardware], dict[str, list]] | None = None,
):
    """Decorator: make ``fn`` available to configs as pass ``name`` with parameters ``config``."""

    def wrap(fn):
        assert name not in PASSES, f"pass {name!r} registered twice"
        PASSES[name] = PassInfo(name, fn, config, reorders, kernel_tiling, sites)
        return fn

    return wrap


def search_sites(name: str):
    """Decorator: ``fn`` is the ``sites`` of the registered pass ``name`` (the blocks it would tile,
    each with the ranking its ``choices`` select from)."""

    def wrap(fn):
        PASSES[name] = replace(PASSES[name], sites=fn)
        return fn

    return wrap
