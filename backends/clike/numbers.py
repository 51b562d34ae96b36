"""Integers the C-like code generator prints, known ones or a shape-generic template's run-time ones.

A generic kernel's template (``backends.symbolic``) holds ``Slot``s where its instances differ; a slot
refuses every use as a number (``SlotUsed``), so the generator asks these helpers instead of
comparing: ``zero``/``one`` are True only for a known 0 or 1 (a slot may be anything: the code then
multiplies or adds it, right for every value), ``text`` prints either (a slot as its argument's
name, ``arg``), ``times`` multiplies without deciding anything (a product with a slot stays a tuple
of factors, which ``value`` evaluates once a kernel's integers are known). On a kernel without
slots every helper is the plain integer's answer, so specialized kernels print as before.
"""

from __future__ import annotations

import math
import re

from backends.symbolic import is_slot

_SLOT = re.compile(r"\$n(\d+)")


def arg(k: int) -> str:
    """The C name of run-time integer ``k`` (a generic kernel's ``long`` argument after its buffers)."""
    return f"tile_n{k}"


def zero(x) -> bool:
    return not is_slot(x) and x == 0


def one(x) -> bool:
    return not is_slot(x) and x == 1


def text(x) -> str:
    """``x`` as a C integer expression (a slot: its argument)."""
    return arg(x.k) if is_slot(x) else str(int(x))


def named(source: str) -> str:
    """``source`` with the slots an f-string printed (``$n3``, their ``repr``) named as arguments."""
    return _SLOT.sub(lambda m: arg(int(m.group(1))), source)


def times(a, b):
    """``a * b``: an int when both are known, else a tuple of factors (ints and slots)."""
    if is_slot(a) or is_slot(b) or isinstance(a, tuple) or isinstance(b, tuple):
        fa = a if isinstance(a, tuple) else (a,)
        fb = b if isinstance(b, tuple) else (b,)
        return tuple(f for f in (*fa, *fb) if is_slot(f) or f != 1)
    return a * b


def known(x) -> bool:
    """Whether ``x`` (a ``times`` result) is a plain integer."""
    return not (is_slot(x) or isinstance(x, tuple))


def expr(x) -> str:
    """A ``times`` result as a C expression (parenthesized when a product)."""
    if isinstance(x, tuple):
        parts = [text(f) for f in x] or ["1"]
        return parts[0] if len(parts) == 1 else "(" + " * ".join(parts) + ")"
    return text(x)


def value(x, values: list[int]) -> int:
    """A ``times`` result (or slot, or int) with the run-time integers ``values`` filled in."""
    if isinstance(x, tuple):
        return math.prod(value(f, values) for f in x)
    return values[x.k] if is_slot(x) else int(x)


__all__ = ["arg", "expr", "known", "named", "one", "text", "times", "value", "zero"]
