"""Located, user-facing errors.

Every mistake a user can make surfaces as a ``TileError`` subclass that names the file, line and
column, shows the source line with a caret under the offending text, and says what would fix it.
Internal invariants use ``assert`` instead: those are our bugs, not the user's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Source:
    """A program text and the name it is reported under (a path or ``<string>``)."""

    text: str
    name: str = "<string>"

    def line(self, lineno: int) -> str:
        # Only "\n" ends a line, as in the lexer; splitlines() would also split at "\f", "\x1c", ...
        lines = self.text.split("\n")
        return lines[lineno - 1].rstrip("\r") if 0 < lineno <= len(lines) else ""


@dataclass(frozen=True, slots=True)
class Span:
    """A run of source text: 1-based line and column of its start, and its length on that line.

    Spans never take part in equality of the nodes that carry them (``field(compare=False)``), so
    a printed-and-reparsed program compares equal to the original.
    """

    line: int
    col: int
    length: int = 1
    source: Source | None = field(default=None, repr=False, compare=False)

    def to(self, other: Span) -> Span:
        """The span from the start of ``self`` to the end of ``other`` (clipped to one line)."""
        if other.line != self.line:
            return self
        end = max(self.col + self.length, other.col + other.length)
        return Span(self.line, self.col, end - self.col, self.source)


class TileError(Exception):
    """A user error with a location, a caret and a hint."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def __str__(self) -> str:
        head = f"{self.kind}: {self.message}"
        parts = []
        span = self.span
        if span is not None and span.source is not None:
            src = span.source
            parts.append(f"{src.name}:{span.line}:{span.col}: {head}")
            text = src.line(span.line)
            if text:
                shown = text.expandtabs(1)
                parts.append(f"    {shown}")
                width = max(1, min(span.length, len(shown) - span.col + 1))
                parts.append("    " + " " * (span.col - 1) + "^" + "~" * (width - 1))
        elif span is not None:
            parts.append(f"<unknown>:{span.line}:{span.col}: {head}")
        else:
            parts.append(head)
        if self.hint:
            parts.append(f"hint: {self.hint}")
        # Lone surrogates (text decoded with errors="surrogateescape") cannot be printed as UTF-8.
        return "\n".join(parts).encode("utf-8", "backslashreplace").decode("utf-8")


class TileSyntaxError(TileError):
    kind = "syntax error"


class TileNameError(TileError):
    kind = "name error"


class TileTypeError(TileError):
    kind = "type error"


class TileShapeError(TileError):
    kind = "shape error"


class TileIndexError(TileError):
    """Index-space problems: non-linear polynomials, unbounded or empty index sets."""

    kind = "index error"


class TileRuntimeError(TileError):
    """Problems only visible while evaluating: duplicate `=` writes, index space too large."""

    kind = "runtime error"


class TileLimitError(TileRuntimeError):
    """The reference interpreter's own bound on an index space (``max_points``): a resource
    limit of that tool, not a rule of the language, so compiled targets need not share it."""


class TileResourceError(TileRuntimeError):
    """A compiled target cannot hold a program's buffers: one buffer or all of them together exceed
    the device's memory or a ``max_buffer_bytes`` / ``max_total_bytes`` setting. Raised before
    anything is allocated."""


class TileInputError(TileError):
    """Input arrays that do not fit the program (missing, wrong rank or size, bad npz)."""

    kind = "input error"


class TileDeviceError(TileInputError):
    """A target id that names no available device (the message lists those that are)."""

    kind = "device error"


class TileBackendError(TileError):
    """A target failed to run a program it was given: a plugin device or an external backend
    that crashed, timed out, broke its protocol or answered outputs of the wrong names, shapes
    or dtypes. The message names the target; it is the target's fault, not the program's."""

    kind = "backend error"


class TilePrecisionWarning(UserWarning):
    """The exact interpreter fell back to float64 for an operation it cannot do exactly."""
