"""Located, user-facing errors.

Every mistake a user can make surfaces as a ``TileError`` subclass that names the file, line and
column, shows the source line with a caret under the offending text, and says what would fix it.
Internal invariants use ``assert`` instead: those are our bugs, not the user's.
"""

from __future__ import annotations

import difflib
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


class Located:
    """A message with a location, a caret and a hint: what ``TileError`` and ``TileWarning`` share
    (``kind`` names the class of message in its first line)."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def __str__(self) -> str:
        return located(self.kind, self.message, self.span, self.hint)


class TileError(Located, Exception):
    """A user error with a location, a caret and a hint."""

    kind = "error"


def located(kind: str, message: str, span: Span | None, hint: str | None) -> str:
    """``file:line:col: kind: message``, the source line with a caret under the span, and the hint.

    Characters a terminal would act on rather than show (NUL, ESC, DEL, C1 controls, bidi
    overrides, lone surrogates of undecodable bytes) are shown as Python escapes such as ``\\x05``,
    and the caret still points at the right place."""
    head = f"{kind}: {message}"
    parts = []
    if span is not None and span.source is not None:
        src = span.source
        parts.append(f"{escape(src.name)}:{span.line}:{span.col}: {head}")
        text = src.line(span.line)
        if text:
            shown = [escape(c) for c in text.expandtabs(1)]
            start = sum(len(c) for c in shown[: span.col - 1]) + max(0, span.col - 1 - len(shown))
            end = sum(len(c) for c in shown[: span.col - 1 + max(1, span.length)])
            line = "".join(shown)
            width = max(1, min(end - start, len(line) - start))
            parts.append(f"    {line}")
            parts.append("    " + " " * start + "^" + "~" * (width - 1))
    elif span is not None:
        parts.append(f"<unknown>:{span.line}:{span.col}: {head}")
    else:
        parts.append(head)
    if hint:
        parts.append(f"hint: {hint}")
    return escape("\n".join(parts), keep="\n")


def escape(text: str, keep: str = "") -> str:
    """``text`` with every character that does not print as itself (``str.isprintable``; a tab and
    the characters in ``keep`` excepted) written as a Python escape: ``\\x00``, ``\\u202e``."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable() or c == "\t" or c in keep:
            out.append(c)
        else:
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


class TileSyntaxError(TileError):
    kind = "syntax error"


class TileNameError(TileError):
    kind = "name error"


def unknown_name(name: str, span: Span | None, known, later: dict) -> TileNameError:
    """The error for a name nothing defines at this point: used before the statement ``later``
    (name -> its span) defines it, or unknown, with the nearest of ``known`` as the hint."""
    if name in later:
        return TileNameError(
            f"'{name}' is used before it is defined (line {later[name].line})",
            span,
            hint="statements run in order; move the definition up",
        )
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "declare it as an input or define it first"
    return TileNameError(f"unknown name '{name}'", span, hint=hint)


def unknown_function(fn: str, span: Span | None, known) -> TileNameError:
    """The error for a call of a function that is not a builtin (``known``: the builtins' names)."""
    close = difflib.get_close_matches(fn, list(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "see docs/semantics.md for the builtins"
    return TileNameError(f"unknown function '{fn}'", span, hint=hint)


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


class TileWarning(Located, UserWarning):
    """Legal Tile that is probably not what was meant, located like a ``TileError``. Each is
    given once per program text and place; silence a kind with
    ``warnings.filterwarnings("ignore", category=tile.TileIndexWarning)`` (on the command line:
    ``python -W ignore::UserWarning -m tile ...``)."""

    kind = "warning"


class TileGradientMemoryWarning(TileWarning):
    """The gradient of a ``>``, ``<`` or ``*`` aggregation over a combination materializes a term
    tensor with one element per index tuple of the forward, far larger than its tensors
    (``tile.autodiff.combined``)."""


class TileIndexWarning(TileWarning):
    """A contraction with an output index that no operand uses while an operand's index is summed
    (``C[i, q: M, N] = +(A[i, k] * B[k, j])``): legal (``q`` broadcasts, ``j`` is summed), and
    almost always a typo for ``j``."""


# The ONNX importer's errors (tile.onnx): here beside the others, so that `tile` exports every
# error class the docs name without importing onnx.
class TileOnnxError(TileError):
    """A model the importer cannot turn into Tile: the message names the node and what to change."""

    kind = "onnx error"


class TileOnnxUnsupported(TileOnnxError):
    """An operator, attribute value or dtype the importer has no converter for."""

    kind = "onnx unsupported"


class TileOnnxValueDependent(TileOnnxError):
    """A node whose output *shape* depends on the values of a graph input (Reshape's ``shape``,
    Slice's ``starts``, ...). ``names`` are the graph inputs whose values would make it static: the
    backend re-imports with those values as constants; ``to_tile`` refuses."""

    kind = "onnx value-dependent shape"

    def __init__(self, message: str, names: tuple[str, ...] = (), hint: str | None = None):
        super().__init__(message, None, hint)
        self.names = tuple(names)
