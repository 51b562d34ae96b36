"""Where each value and key of a JSON text is: ``positions(text)`` maps a path (``("passes", 3,
"params")``) to the ``(line, col, length)`` of that value, and ``path + (KEY,)`` to its key's.

``json.loads`` gives the values; this gives config errors a place to point their caret at. The
text must already be valid JSON (``json.loads`` reports syntax errors with their position).
"""

from __future__ import annotations

import re

KEY = "\0key"  # a path's last element marking the key of a member rather than its value

_WS = re.compile(r"[ \t\r\n]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
# (Python's json also reads NaN and Infinity, which the config reader then refuses at their place)
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity")

Path = tuple
Pos = tuple[int, int, int]


def positions(text: str) -> dict[Path, Pos]:
    out: dict[Path, Pos] = {}
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def where(i: int, j: int) -> Pos:
        line = _line_of(starts, i)
        return line + 1, i - starts[line] + 1, max(1, min(j, _line_end(text, i)) - i)

    def skip(i: int) -> int:
        return _WS.match(text, i).end()

    def value(i: int, path: Path) -> int:
        i = skip(i)
        c = text[i]
        if c == "{":
            j = skip(i + 1)
            while text[j] != "}":
                m = _STRING.match(text, j)
                key = _decode(m.group())
                out[path + (key, KEY)] = where(j, m.end())
                j = skip(m.end())
                j = value(j + 1, path + (key,))  # past the ':'
                j = skip(j)
                if text[j] == ",":
                    j = skip(j + 1)
            out[path] = where(i, j + 1)
            return j + 1
        if c == "[":
            j, k = skip(i + 1), 0
            while text[j] != "]":
                j = skip(value(j, path + (k,)))
                k += 1
                if text[j] == ",":
                    j = skip(j + 1)
            out[path] = where(i, j + 1)
            return j + 1
        m = _STRING.match(text, i) if c == '"' else _SCALAR.match(text, i)
        out[path] = where(i, m.end())
        return m.end()

    value(0, ())
    return out


def _decode(s: str) -> str:
    import json

    return json.loads(s)


def _line_of(starts: list[int], i: int) -> int:
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= i:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j
