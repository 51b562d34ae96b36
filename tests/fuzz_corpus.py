"""The valid Tile programs the front-end fuzz mutates: every string constant in the test modules
and every fenced code block of docs/semantics.md that ``tile.parse`` accepts.

Read from the files rather than copied, so the corpus grows with the tests; a string that does not
parse (the error tests' inputs) is simply not a seed.
"""

from __future__ import annotations

import ast as pyast
import functools
import re
from pathlib import Path

from tile.errors import TileError
from tile.parser import parse

ROOT = Path(__file__).resolve().parent.parent
_SOURCES = ("tests/*.py", "conformance/*.py")
_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def _candidates() -> list[str]:
    found: list[str] = []
    for pattern in _SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            tree = pyast.parse(path.read_text(encoding="utf-8"))
            found += [
                n.value
                for n in pyast.walk(tree)
                if isinstance(n, pyast.Constant) and isinstance(n.value, str) and "function" in n.value
            ]
    found += _FENCE.findall((ROOT / "docs" / "semantics.md").read_text(encoding="utf-8"))
    return found


@functools.cache
def programs() -> tuple[str, ...]:
    """The distinct valid programs, in a stable order (Hypothesis shrinks towards the first)."""
    valid: dict[str, None] = {}
    for text in _candidates():
        try:
            parse(text)
        except TileError:
            continue
        valid.setdefault(text.strip(), None)
    return tuple(sorted(valid, key=lambda t: (len(t), t)))


if __name__ == "__main__":
    print(f"{len(programs())} programs")
