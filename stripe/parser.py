"""Read Stripe text back into a Block tree: ``parse_stripe(format_block(b)) == b`` for every block.

The original had only a printer (round trips went through protobuf); here the text is the
format of pass tests (Before/Expected pairs), so it has a grammar and located errors. The
grammar, with the details of names, numbers and comments, is in ``stripe.printer``'s docstring::

    program  := [INT ':'] block
    block    := {'#' name ['=' value]} 'block' [loc] '[' [index {',' index}] ']'
                '(' [NAMECOMMENT] {COMMENT | plan | affine '>=' '0' | ref} ')' '{' {INT ':' stmt [';']} '}'
    plan     := 'plan' name '(' [name ':' value {',' name ':' value}] ')'    (stripe.plans)
    index    := name ':' int ['=' affine]
    ref      := {'#' name} dir [loc] ['const'] [OFFSET] name ['=' name]
                '[' [affine {',' affine}] ']' [':' name] DTYPE '(' [int ':' int {',' int ':' int}] ')'
    loc      := '<' [name] ['[' affine {',' affine} ']'] '>'
    stmt     := block | name '=' ('load' '(' name ')' | 'store' '(' name ')' | 'load_index' '(' affine ')')
              | name '=' '(' DTYPE ')' number
              | [name {',' name} '='] name '(' [names] [ints] [strings] ')' [':' DTYPE]
    affine   := ['-'] term {('+' | '-') term};  term := factor {('*' | '/') factor}, factor := INT | name

A call with ``:DTYPE`` is an Intrinsic, one without is a Special. Statement numbers must count
0, 1, 2, ...; errors are ``TileSyntaxError``s with a caret and a hint.

The parser is four classes, each a layer of the grammar on the one below: ``_Tokens`` (the token
stream and the atoms: names, numbers, strings, element types), ``_Affines`` (``affine`` and
``loc``), ``_Declarations`` (``index``, constraints, ``ref``), ``_Parser`` (``program``, ``block``
and ``stmt``, which nest in each other).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction

from stripe import plans
from stripe.ir import (
    DTYPES_BY_NAME,
    Block,
    Constant,
    Dim,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    Location,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
    TensorShape,
)
from stripe.plans import Plan
from stripe.printer import KEYWORDS
from tile.affine import Affine
from tile.dtypes import DType
from tile.errors import Source, Span, TileSyntaxError

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r\n]+)
      | (?P<COMMENT>//[^\n]*)
      | (?P<OFFSET>@0x[0-9a-fA-F]+)
      | (?P<FLOAT>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)
      | (?P<INT>\d+)
      | (?P<NAME>[A-Za-z_$][A-Za-z0-9_$']*)
      | (?P<QNAME>`[^`\n]*`)
      | (?P<STRING>"(?:[^"\\\n]|\\.)*")
      | (?P<OP>>=|[#:,\[\](){}<>=+\-*/;])""",
    re.VERBOSE,
)
_DIRS = {d.value: d for d in RefDir}
_STMT_KEYWORDS = ("load", "store", "load_index")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # COMMENT NAME QNAME STRING INT FLOAT OFFSET OP EOF
    text: str
    span: Span

    def is_op(self, *texts: str) -> bool:
        return self.kind == "OP" and self.text in texts

    def is_kw(self, *words: str) -> bool:
        return self.kind == "NAME" and self.text in words


def _describe(tok: Token) -> str:
    return "the end of the text" if tok.kind == "EOF" else f"'{tok.text}'"


def tokenize(text: str, source: Source) -> list[Token]:
    out: list[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        span = Span(line, pos - line_start + 1, 1, source)
        if m is None:
            ch = text[pos]
            hint = "names with other characters are written between backticks: `my name`"
            if ch in '`"':
                hint = "close the quote on the same line"
            raise TileSyntaxError(f"unexpected character {ch!r}", span, hint)
        kind, tok = m.lastgroup, m.group()
        if kind == "ws":
            line += tok.count("\n")
            if "\n" in tok:
                line_start = pos + tok.rindex("\n") + 1
        else:
            out.append(Token(kind, tok, Span(span.line, span.col, len(tok), source)))
        pos = m.end()
    out.append(Token("EOF", "", Span(line, pos - line_start + 1, 1, source)))
    return out


def _comment_text(tok: Token) -> str:
    body = tok.text[2:].strip()
    if body.startswith('"'):
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            raise TileSyntaxError(
                "a comment starting with '\"' must be one JSON string",
                tok.span,
                'write other text without the leading quote, or quote the whole comment: // "text"',
            ) from None
        if isinstance(value, str):
            return value
        raise TileSyntaxError("a quoted comment must be a JSON string", tok.span, 'write // "text"')
    return body


class _Tokens:
    """The token stream (comments are skipped, except where a block header reads them) and the
    grammar's atoms: names (plain or quoted), integers, numbers, strings and element types."""

    def __init__(self, text: str, name: str):
        self.toks = tokenize(text, Source(text, name))
        self.pos = 0

    @property
    def raw(self) -> Token:
        return self.toks[self.pos]

    @property
    def tok(self) -> Token:
        """The next token that is not a comment (comments outside block headers are dropped)."""
        while self.toks[self.pos].kind == "COMMENT":
            self.pos += 1
        return self.toks[self.pos]

    def advance(self) -> Token:
        tok = self.tok
        self.pos += 1
        return tok

    def error(self, what: str, hint: str | None = None, tok: Token | None = None) -> TileSyntaxError:
        tok = tok or self.tok
        return TileSyntaxError(f"expected {what}, found {_describe(tok)}", tok.span, hint)

    def expect(self, op: str, hint: str | None = None) -> Token:
        if not self.tok.is_op(op):
            raise self.error(f"'{op}'", hint)
        return self.advance()

    def accept(self, op: str) -> bool:
        if self.tok.is_op(op):
            self.advance()
            return True
        return False

    def expect_kw(self, word: str, hint: str | None = None) -> Token:
        if not self.tok.is_kw(word):
            raise self.error(f"'{word}'", hint)
        return self.advance()

    def at_name(self) -> bool:
        t = self.tok
        return t.kind == "QNAME" or (t.kind == "NAME" and t.text not in KEYWORDS)

    def name(self, what: str = "a name") -> str:
        t = self.tok
        if t.kind == "QNAME":
            self.advance()
            try:
                return json.loads('"' + t.text[1:-1] + '"')
            except json.JSONDecodeError:
                raise TileSyntaxError(
                    f"bad escape in the quoted name {t.text}",
                    t.span,
                    'inside backticks, write " as \\" and \\ as \\\\ (JSON escapes)',
                ) from None
        if t.kind == "NAME" and t.text not in KEYWORDS:
            return self.advance().text
        hint = f"'{t.text}' is a keyword; quote it as a name: `{t.text}`" if t.kind == "NAME" else None
        raise self.error(what, hint)

    def int_(self, what: str = "an integer") -> int:
        neg = self.accept("-")
        if self.tok.kind != "INT":
            raise self.error(what)
        value = int(self.advance().text)
        return -value if neg else value

    def number(self) -> int | float | bool:
        if self.tok.is_kw("true", "false"):
            return self.advance().text == "true"
        neg = self.accept("-")
        t = self.tok
        if t.kind == "INT":
            value: int | float = int(t.text)
        elif t.kind == "FLOAT" or t.is_kw("inf", "nan"):
            value = float(t.text)
        else:
            raise self.error("a number", "ints are `3`, floats `1.5`, `1e-07`, `inf`, `nan`; bools `true`")
        self.advance()
        return -value if neg else value

    def string(self) -> str:
        t = self.advance()
        return json.loads(t.text)

    def value(self) -> int | float | str | bool:
        return self.string() if self.tok.kind == "STRING" else self.number()

    def dtype(self) -> DType:
        t = self.tok
        if t.kind == "NAME" and t.text in DTYPES_BY_NAME:
            self.advance()
            return DTYPES_BY_NAME[t.text]
        raise self.error("an element type", "one of " + ", ".join(DTYPES_BY_NAME))


class _Affines(_Tokens):
    """Affine expressions (exact, with ``Fraction`` coefficients), lists of them, and locations."""

    def affine(self) -> Affine:
        coeffs: dict[str, Fraction] = {}
        const = Fraction(0)
        sign = -1 if self.accept("-") else 1
        while True:
            coeff, var = self.term()
            coeff *= sign
            if var is None:
                const += coeff
            else:
                coeffs[var] = coeffs.get(var, Fraction(0)) + coeff
            if self.accept("+"):
                sign = 1
            elif self.accept("-"):
                sign = -1
            else:
                break
        return Affine.build(coeffs, const)

    def term(self) -> tuple[Fraction, str | None]:
        coeff, var = Fraction(1), None
        op = "*"
        while True:
            t = self.tok
            if t.kind == "INT":
                n = int(self.advance().text)
                if op == "/" and n == 0:
                    raise TileSyntaxError("division by zero in an affine", t.span, "divide by a non-zero int")
                coeff = coeff / n if op == "/" else coeff * n
            elif self.at_name() and op == "*":
                if var is not None:
                    raise TileSyntaxError(
                        f"'{var} * ...' multiplies two indexes", t.span, "Stripe affines are linear"
                    )
                var = self.name()
            else:
                what = "an integer" if op == "/" else "an index name or an integer"
                raise self.error(what, "affines are sums of terms like `2*x`, `-1`, `1/2*y`")
            if self.accept("*"):
                op = "*"
            elif self.accept("/"):
                op = "/"
            else:
                return coeff, var

    def affines(self, close: str) -> tuple[Affine, ...]:
        out: list[Affine] = []
        if not self.tok.is_op(close):
            out.append(self.affine())
            while self.accept(","):
                out.append(self.affine())
        self.expect(close)
        return tuple(out)

    def location(self) -> Location | None:
        if not self.accept("<"):
            return None
        name = self.name("a location name") if self.at_name() else ""
        units = self.affines("]") if self.accept("[") else ()
        self.expect(">", "a location is `<NAME>` or `<NAME[unit, ...]>`, e.g. `<GPU[0]>`")
        return Location(name, units)


class _Declarations(_Affines):
    """What a block declares: indexes, constraints, and refinements with their dims."""

    def index(self) -> Index:
        name = self.name("an index name")
        self.expect(":", "an index is `name:range` or `name:range = affine`")
        rng = self.int_("the index's range")
        return Index(name, rng, self.affine() if self.accept("=") else None)

    def constraint(self) -> Affine:
        a = self.affine()
        self.expect(">=", "a constraint is `affine >= 0`")
        t = self.tok
        if self.int_("0") != 0:
            raise TileSyntaxError("a constraint compares with 0", t.span, "move the constant: `x - 3 >= 0`")
        return a

    def ref(self) -> Refinement:
        tags: set[str] = set()
        while self.accept("#"):
            tags.add(self.name("a tag name"))
            if self.tok.is_op("="):
                raise self.error("a refinement", "refinements have tags (`#name`) but no attributes")
        t = self.tok
        if not t.is_kw(*_DIRS):
            raise self.error("a direction", "a refinement starts with none, in, out or inout")
        direction = _DIRS[self.advance().text]
        location = self.location()
        is_const = self.tok.is_kw("const")
        if is_const:
            self.advance()
        offset = int(self.advance().text[3:], 16) if self.tok.kind == "OFFSET" else None
        into = self.name("the refinement's name")
        from_ = self.name("the name of the refined parent") if self.accept("=") else None
        self.expect("[", "the access follows the name: `I[x, y + 1]` (`[]` for a scalar)")
        access = self.affines("]")
        agg = self.name("an aggregation") if self.accept(":") else ""
        dtype = self.dtype()
        self.expect("(", "the dims follow the element type: `fp32(4:3, 3:1)` (size:stride)")
        dims: list[Dim] = []
        if not self.tok.is_op(")"):
            dims.append(self.dim())
            while self.accept(","):
                dims.append(self.dim())
        self.expect(")")
        return Refinement(
            direction,
            into,
            access,
            TensorShape(dtype, tuple(dims)),
            from_,
            agg,
            location,
            is_const,
            frozenset(tags),
            offset,
        )

    def dim(self) -> Dim:
        size = self.int_("a size")
        self.expect(":", "a dim is `size:stride`")
        return Dim(size, self.int_("a stride"))


class _Parser(_Declarations):
    """A program: blocks (tags, location, indexes, header, numbered statements) and statements
    (nested blocks, loads and stores, constants, intrinsics and specials)."""

    def program(self) -> Block:
        if self.tok.kind == "INT":
            self.statement_number(0)
        block = self.block()
        if self.tok.kind != "EOF":
            raise self.error("the end of the text", "the text holds one root block")
        return block

    def statement_number(self, expected: int) -> None:
        t = self.tok
        if t.kind != "INT":
            raise self.error(f"the statement number '{expected}:'", "statements are written `k: ...`")
        if int(t.text) != expected:
            hint = f"statements count up from 0: this one is {expected}"
            raise TileSyntaxError(f"statement number {t.text} out of order", t.span, hint)
        self.advance()
        self.expect(":")

    def block(self) -> Block:
        tags, attrs = self.block_tags()
        self.expect_kw("block", "a block is `#tags block [idx:range, ...] ( refs ) { statements }`")
        location = self.location()
        idxs = self.indexes()
        name, comments, plan, constraints, refs = self.header()
        stmts = self.body()
        return Block(name, idxs, constraints, refs, stmts, tags, comments, location, attrs, plan)

    def block_tags(self) -> tuple[frozenset[str], tuple[tuple[str, int | float | str | bool], ...]]:
        """``#tag`` and ``#key=value`` before ``block``."""
        tags: set[str] = set()
        attrs: list[tuple[str, int | float | str | bool]] = []
        while self.accept("#"):
            key = self.name("a tag name")
            if self.accept("="):
                attrs.append((key, self.value()))
            else:
                tags.add(key)
        return frozenset(tags), tuple(attrs)

    def indexes(self) -> tuple[Index, ...]:
        self.expect("[", "the index list `[i:4, j:2]` follows `block` (`[]` for none)")
        idxs: list[Index] = []
        if not self.tok.is_op("]"):
            idxs.append(self.index())
            while self.accept(","):
                idxs.append(self.index())
        self.expect("]")
        return tuple(idxs)

    def header(self) -> tuple[str, tuple[str, ...], Plan | None, tuple[Affine, ...], tuple[Refinement, ...]]:
        """``( ... )``: the name (a comment on the line of ``(``), comments, the plan, constraints
        and refs."""
        paren = self.expect("(", "the block's refinements and constraints follow its indexes in `( ... )`")
        name = ""
        if self.raw.kind == "COMMENT" and self.raw.span.line == paren.span.line:
            name = _comment_text(self.raw)
            self.pos += 1
        comments: list[str] = []
        constraints: list[Affine] = []
        refs: list[Refinement] = []
        plan = None
        while True:
            if self.raw.kind == "COMMENT":
                comments.append(_comment_text(self.raw))
                self.pos += 1
            elif self.raw.is_kw("plan"):
                if plan is not None:
                    raise TileSyntaxError("a second plan", self.raw.span, "a block has at most one plan")
                plan = self.plan()
            elif self.raw.is_op(")"):
                break
            elif self.raw.is_op("#") or self.raw.is_kw(*_DIRS):
                refs.append(self.ref())
            elif self.raw.kind == "EOF":
                raise self.error("')'", "close the block header with `) {`")
            else:
                constraints.append(self.constraint())
        self.expect(")")
        return name, tuple(comments), plan, tuple(constraints), tuple(refs)

    def plan(self) -> Plan:
        """``plan KIND(field: value, ...)`` (``stripe.plans``)."""
        self.expect_kw("plan")
        at = self.tok
        kind = self.name("the plan's kind")
        self.expect("(", "a plan is `plan KIND(field: value, ...)`")
        values: dict[str, object] = {}
        while not self.tok.is_op(")"):
            if values:
                self.expect(",")
            key = self.advance().text if self.tok.kind == "NAME" else self.name("a plan field")  # `out` too
            self.expect(":", "a plan field is `name: value`")
            values[key] = self.plan_value()
        self.expect(")")
        try:
            return plans.make(kind, values)
        except ValueError as e:
            raise TileSyntaxError(str(e), at.span, "write the plan as stripe.printer prints it") from None

    def plan_value(self) -> object:
        """An int, a bool, a name, or a list of names with or without ``:int``."""
        if self.tok.is_kw("true", "false"):
            return self.advance().text == "true"
        if self.tok.kind == "INT" or self.tok.is_op("-"):
            return self.int_()
        if not self.accept("["):
            return self.name("a plan value")
        out: list = []
        while not self.tok.is_op("]"):
            if out:
                self.expect(",")
            item = self.name("an index or refinement name")
            out.append((item, self.int_()) if self.accept(":") else item)
        self.expect("]")
        return tuple(out)

    def body(self) -> tuple[Statement, ...]:
        """``{ 0: stmt 1: stmt ... }``, numbered from 0."""
        self.expect("{", "the block's statements follow in `{ ... }`")
        stmts: list[Statement] = []
        while not self.tok.is_op("}"):
            if self.tok.kind == "EOF":
                raise self.error("'}'", "close the block's statements with `}`")
            self.statement_number(len(stmts))
            stmts.append(self.statement())
            self.accept(";")
        self.expect("}")
        return tuple(stmts)

    def statement(self) -> Statement:
        t = self.tok
        if t.is_op("#") or t.is_kw("block"):
            return self.block()
        if not self.at_name():
            raise self.error("a statement", "e.g. `$x = load(X)`, `X = store($x)` or a nested block")
        first = self.name()
        if self.tok.is_op("("):
            return self.call((), first)
        lhs = [first]
        while self.accept(","):
            lhs.append(self.name())
        self.expect("=", "a statement is `outputs = operation(inputs)`")
        callee = self.tok
        if callee.is_op("("):
            self.advance()
            dtype = self.dtype()
            self.expect(")")
            value = self.number()
            return Constant(self.single(lhs, "a constant", t), value, dtype)
        if callee.is_kw(*_STMT_KEYWORDS):
            self.advance()
            self.expect("(")
            if callee.text == "load_index":
                affine = self.affine()
                self.expect(")")
                return LoadIndex(affine, self.single(lhs, "load_index", t))
            arg = self.name("a name")
            self.expect(")")
            if callee.text == "load":
                return Load(arg, self.single(lhs, "load", t))
            return Store(arg, self.single(lhs, "store", t))
        return self.call(tuple(lhs), self.name("an operation name"))

    def single(self, lhs: list[str], what: str, at: Token) -> str:
        if len(lhs) != 1:
            raise TileSyntaxError(f"{what} has one output, not {len(lhs)}", at.span, "assign it to one name")
        return lhs[0]

    def call(self, outputs: tuple[str, ...], name: str) -> Statement:
        self.expect("(")
        inputs: list[str] = []
        ints: list[int] = []
        strs: list[str] = []
        order_hint = "arguments are names, then integer params, then string params"
        while not self.tok.is_op(")"):
            if (inputs or ints or strs) and not self.accept(","):
                raise self.error("',' or ')'")
            t = self.tok
            if self.at_name():
                if ints or strs:
                    raise self.error("an integer or string parameter", order_hint)
                inputs.append(self.name())
            elif t.kind == "INT" or t.is_op("-"):
                if strs:
                    raise self.error("a string parameter", order_hint)
                ints.append(self.int_())
            elif t.kind == "STRING":
                strs.append(self.string())
            else:
                raise self.error("an argument", order_hint)
        close = self.expect(")")
        if not self.accept(":"):
            return Special(name, tuple(inputs), outputs, tuple(ints), tuple(strs))
        if strs:
            raise TileSyntaxError(
                "an intrinsic (typed with `:dtype`) has no string parameters",
                close.span,
                "drop the `:dtype` to make it a Special",
            )
        return Intrinsic(name, tuple(inputs), outputs, self.dtype(), tuple(ints))


def parse_stripe(text: str, name: str = "<string>") -> Block:
    """The Block tree written in ``text``; ``name`` is the file name errors report."""
    return _Parser(text, name).program()


parse = parse_stripe

__all__ = ["parse", "parse_stripe", "tokenize"]
