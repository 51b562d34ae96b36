"""Tokens of the Tile language.

Token kinds:
    ID      ``[A-Z][A-Za-z0-9_]*'?``   tensors, dimensions, named constants
    IDX     ``[a-z][A-Za-z0-9_]*'?``   index variables, function names, keywords
    INT     ``[0-9]+``
    FLOAT   ``[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?`` with a fraction or an exponent
    OP      punctuation, longest match first
    EOF
``//`` starts a comment that runs to the end of the line (the original had none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tile.errors import Source, Span, TileSyntaxError

KEYWORDS = frozenset({"function", "default", "no_defract"})

# Longest first, so `==` wins over `=` and `->` over `-`.
OPERATORS = (
    "[[",
    "]]",
    "->",
    "==",
    "!=",
    "<=",
    ">=",
    "<<",
    ">>",
    "+",
    "-",
    "*",
    "/",
    "=",
    "<",
    ">",
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    ";",
    "?",
    "&",
    "|",
    "^",
    "~",
)

_LONG_OPS = frozenset(op for op in OPERATORS if len(op) == 2)
_SHORT_OPS = frozenset(op for op in OPERATORS if len(op) == 1)
assert _LONG_OPS | _SHORT_OPS == set(OPERATORS)  # so "longest first" is: two characters, then one

_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*'?")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # ID, IDX, INT, FLOAT, OP, KEYWORD, EOF
    text: str
    span: Span

    def is_op(self, *texts: str) -> bool:
        return self.kind == "OP" and self.text in texts


def _hint_for(ch: str) -> str:
    hints = {
        "!": "Tile has no logical not; write `X == 0`",
        "%": "Tile has no modulo operator on tensors",
        '"': "Tile has no strings",
        "#": "comments start with //",
    }
    return hints.get(ch, "remove it")


def tokenize(source: Source) -> list[Token]:
    """Split ``source`` into tokens, raising ``TileSyntaxError`` at the first bad character."""
    text = source.text
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    n = len(text)

    def span(start: int, length: int) -> Span:
        return Span(line, start - line_start + 1, max(1, length), source)

    while pos < n:
        ch = text[pos]
        if ch == "\n":
            pos += 1
            line += 1
            line_start = pos
            continue
        if ch in " \t\r\f":
            pos += 1
            continue
        if text.startswith("//", pos):
            end = text.find("\n", pos)
            pos = n if end < 0 else end
            continue
        if "0" <= ch <= "9":  # not str.isdigit(): that accepts '²' and other non-ASCII digits
            m = _NUMBER.match(text, pos)
            assert m is not None
            end = m.end()
            if end < n and text[end] == "." and not (m.group(1) or m.group(2)):
                raise TileSyntaxError(
                    f"malformed number '{text[pos : end + 1]}'",
                    span(pos, end + 1 - pos),
                    hint=f"write '{text[pos:end]}.0' (a float needs digits after the point)",
                )
            kind = "FLOAT" if (m.group(1) or m.group(2)) else "INT"
            tokens.append(Token(kind, text[pos:end], span(pos, end - pos)))
            pos = end
            continue
        if ch == "." and pos + 1 < n and "0" <= text[pos + 1] <= "9":
            m = _NUMBER.match(text, pos + 1)
            assert m is not None
            raise TileSyntaxError(
                f"malformed number '.{m.group(0)}'",
                span(pos, m.end() - pos),
                hint=f"write '0.{m.group(0)}' (a float needs a digit before the point)",
            )
        if ch.isascii() and ch.isalpha():
            m = _NAME.match(text, pos)
            assert m is not None
            word = m.group(0)
            if word in KEYWORDS:
                kind = "KEYWORD"
            else:
                kind = "ID" if word[0].isupper() else "IDX"
            tokens.append(Token(kind, word, span(pos, len(word))))
            pos = m.end()
            continue
        op = text[pos : pos + 2]
        if op not in _LONG_OPS:
            op = ch if ch in _SHORT_OPS else ""
        if op:
            tokens.append(Token("OP", op, span(pos, len(op))))
            pos += len(op)
        else:
            shown = ch if ch.isprintable() and not 0xD800 <= ord(ch) < 0xE000 else f"U+{ord(ch):04X}"
            raise TileSyntaxError(f"unexpected character '{shown}'", span(pos, 1), hint=_hint_for(ch))
    tokens.append(Token("EOF", "", span(pos, 1)))
    return tokens
