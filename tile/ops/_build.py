"""Shared pieces of the op builders: literals, names, attribute checks and the function text."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def lit(x: float) -> str:
    """A float as a Tile literal: its shortest repr (exact decimal, §4.2), negatives parenthesized."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"a Tile literal must be finite, not {x}")
    text = repr(abs(x))
    return f"(-{text})" if math.copysign(1.0, x) < 0 else text


def ints(value: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
    """One int per spatial dimension: a single int is repeated, a sequence must have ``n`` items."""
    if isinstance(value, int):
        return (value,) * n
    out = tuple(value)
    if len(out) != n or not all(isinstance(v, int) for v in out):
        raise ValueError(f"{what} must be an int or {n} ints, not {value!r}")
    return out


def positive(values: Iterable[int], what: str) -> None:
    if any(v < 1 for v in values):
        raise ValueError(f"{what} must be at least 1, not {tuple(values)!r}")


def axis(a: int, rank: int) -> int:
    """``a`` as a non-negative axis of a rank-``rank`` tensor (negative counts from the end)."""
    if not -rank <= a < rank:
        raise ValueError(f"axis {a} is out of range for rank {rank}")
    return a % rank


def axes(value: int | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Distinct sorted axes; ``None`` means all of them."""
    if value is None:
        return tuple(range(rank))
    items = (value,) if isinstance(value, int) else tuple(value)
    out = sorted({axis(a, rank) for a in items})
    if len(out) != len(items):
        raise ValueError(f"repeated axis in {value!r}")
    return tuple(out)


def check_rank(rank: int, low: int = 0) -> None:
    if not isinstance(rank, int) or rank < low:
        raise ValueError(f"rank must be an int of at least {low}, not {rank!r}")


def layout_of(layout: str, nd: int) -> bool:
    """Whether ``layout`` is channels-last, for an ``nd``-d spatial op. Accepts ``channels_first``,
    ``channels_last`` or a layout string such as ``NCHW``/``NHWC`` of length nd + 2."""
    if layout in ("channels_first", "channels_last"):
        return layout == "channels_last"
    if len(layout) == nd + 2 and layout[0] == "N" and "C" in layout:
        if layout[1] == "C":
            return False
        if layout[-1] == "C":
            return True
    raise ValueError(f"layout {layout!r} is neither channels-first nor channels-last for {nd}-d data")


def dims(prefix: str, rank: int) -> list[str]:
    return [f"{prefix}{k}" for k in range(rank)]


def header(inputs: Sequence[str], outputs: Sequence[str]) -> str:
    return f"function ({', '.join(inputs)}) -> ({', '.join(outputs)})"


def decl(name: str, names: Sequence[str]) -> str:
    """An input declaration ``X[D0, D1]`` (``X[]`` for rank 0)."""
    return f"{name}[{', '.join(names)}]"


def function(inputs: Sequence[str], outputs: Sequence[str], body: Sequence[str]) -> str:
    """The Tile function text: one statement a line, each ending in ``;``."""
    lines = "".join(f"    {s.rstrip(';')};\n" for s in body)
    return f"{header(inputs, outputs)} {{\n{lines}}}\n"


def ref(name: str, idx: Sequence[str]) -> str:
    return f"{name}[{', '.join(idx)}]"


def out(name: str, idx: Sequence[str], sizes: Sequence[str]) -> str:
    """A contraction's output ``O[i, j: N, M]`` (``O[]`` for a scalar)."""
    if not idx:
        return f"{name}[]"
    return f"{name}[{', '.join(idx)}: {', '.join(sizes)}]"


def product(names: Sequence[str]) -> str:
    return " * ".join(names) if names else "1"


def term(coef: int, name: str) -> str:
    """``coef*name`` without a needless 1 (``2*k``, ``k``); 0 gives ``""``."""
    if coef == 0:
        return ""
    return name if coef == 1 else f"{coef}*{name}"


def poly(*terms: str) -> str:
    """A sum of terms, dropping empty ones; ``-x`` terms are written as subtraction."""
    parts = [t for t in terms if t]
    if not parts:
        return "0"
    text = parts[0]
    for t in parts[1:]:
        text += f" - {t[1:]}" if t.startswith("-") else f" + {t}"
    return text


def plus(c: int) -> str:
    """`` + c`` or `` - |c|`` to follow an expression; nothing for 0."""
    return f" + {c}" if c > 0 else f" - {-c}" if c < 0 else ""
