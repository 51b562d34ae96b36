"""The pass registry: a target config names passes by these names.

A pass is a pure function ``fn(program: Block, cfg: <Config>, hw: Hardware) -> Block`` taking and
returning the whole ``#program`` tree, with a frozen-dataclass config whose fields are the
``params`` a config file may give (``stripe.config`` checks names and types against it).
``reorders`` says whether the pass may change the order in which one element's aggregation
receives its values (splitting a reduction index does); ``settings={"strict": True}`` skips such
passes so compiled results stay bit-identical to the interpreter's order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stripe.hardware import Hardware
from stripe.ir import Block


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable[[Block, object, Hardware], Block]
    config: type
    reorders: bool = False


PASSES: dict[str, PassInfo] = {}


def register(name: str, config: type, *, reorders: bool = False):
    """Decorator: make ``fn`` available to configs as pass ``name`` with parameters ``config``."""

    def wrap(fn):
        assert name not in PASSES, f"pass {name!r} registered twice"
        PASSES[name] = PassInfo(name, fn, config, reorders)
        return fn

    return wrap
