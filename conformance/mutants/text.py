"""Rewrites of generated program text, shared by the LLVM and OpenCL defects."""

from __future__ import annotations

import re
from collections.abc import Callable


def sub(pattern: str, repl: str | Callable) -> Callable[[str], str]:
    """Every match of ``pattern`` replaced (``re.sub``): the text as it was where none occurs."""
    rx = re.compile(pattern)
    return lambda text: rx.sub(repl, text)


def minus_one(pattern: str, above: int = 1) -> Callable[[str], str]:
    """Every integer bound captured as the group ``n`` (when above ``above``) made one smaller."""

    def repl(m: re.Match) -> str:
        n = int(m.group("n"))
        if n <= above:
            return m.group(0)
        a, b = m.span("n")
        return m.group(0)[: a - m.start()] + str(n - 1) + m.group(0)[b - m.start() :]

    return sub(pattern, repl)
