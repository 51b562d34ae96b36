"""The text of one C-like function body as it is emitted: indented lines, fresh names, constants.

``CodeWriter`` is what every emitter of statements writes through (``kernel.KernelEmitter`` for
blocks, ``specials`` for the ``Special`` statements): ``line`` at the current depth, ``scope`` for
a braced block, ``fresh`` for a name no other in the function has, ``declare``/``tmp`` for a
``const`` register holding an expression.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from backends.clike.target import CTarget
from tile.dtypes import DType


class CodeWriter:
    """Lines of one function for target ``t``; ``long`` is its int64 type."""

    def __init__(self, t: CTarget):
        self.t = t
        self.lines: list[str] = []
        self.depth = 0
        self.names: set[str] = set()
        self.long = t.reg(DType.INT64)

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    @contextmanager
    def scope(self, head: str):
        self.line(f"{head} {{" if head else "{")
        self.depth += 1
        yield
        self.depth -= 1
        self.line("}")

    def fresh(self, base: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_]", "_", base)
        out, k = name, 1
        while out in self.names:
            out, k = f"{name}_{k}", k + 1
        self.names.add(out)
        return out

    def declare(self, dt: DType, expr: str, base: str = "t") -> str:
        var = self.fresh(base)
        self.line(f"const {self.t.reg(dt)} {var} = {expr};")
        return var

    def tmp(self, expr: str, dt: DType) -> str:
        return self.declare(dt, expr)


__all__ = ["CodeWriter"]
