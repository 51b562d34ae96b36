"""Recursive-descent parser for Tile.

Grammar (``{x}`` repeats, ``[x]`` is optional; ``//`` comments are dropped by the lexer)::

    program     := "function" "(" [input {"," input}] ")" "->" "(" ID {"," ID} ")"
                   "{" {statement} "}"
    input       := ID                                  any rank, no dims bound
                 | ID "[" [ID {"," ID}] "]"            dims bound by name; "[]" is 0-D
    statement   := {attribute} (assignment | contraction) ";"  |  ";"
    attribute   := "[[" IDX ["(" name {"," name} ")"] "]]"       accepted and ignored
    assignment  := ID "=" expr
    contraction := ID "[" [poly {"," poly}] [":" [expr {"," expr}]] "]" "=" aggop
                   combination {"," constraint} {suffix}
    aggop       := "+" | "*" | ">" | "<" | "="        ("= =(" may be written "==(")
    combination := "(" operand [combop operand ["?" operand]] ")"
    combop      := "*" | "+" | "=="                   ("A == B ? C" is the conditional form)
    operand     := ID "[" [poly {"," poly}] "]"
    constraint  := poly "<" poly                      meaning 0 <= poly < bound
    suffix      := "no_defract" | "default" ID
    expr        := or ["?" expr ":" expr]             right-associative
    or          := xor {"|" xor}          xor := and {"^" and}       and := equality {"&" equality}
    equality    := relational [("==" | "!=") relational]             non-associative
    relational  := shift [("<" | ">" | "<=" | ">=") shift]           non-associative
    shift       := poly {("<<" | ">>") poly}
    poly        := term {("+" | "-") term}
    term        := unary {("*" | "/") unary}
    unary       := ("-" | "~") unary | primary
    primary     := INT | INT IDX (adjacent: "2i" is 2*i) | FLOAT | ID | IDX
                 | IDX "(" [expr {"," expr}] ")" | "(" expr ")"

Operator precedence is C's (``|`` below ``^`` below ``&``); the original put ``^`` below ``|``.

The parser is four classes, each a layer of the grammar on the one below: ``_Tokens`` (the
token stream: expecting and accepting tokens), ``_Expressions`` (``expr`` down to ``primary``, with
the nesting limit), ``_Contractions`` (``contraction`` and its parts), ``_Parser`` (``program``,
inputs, outputs and statements).

Limits: an expression nests at most ``MAX_NESTING`` levels (see ``_Expressions.enter``), so no later
stage (binder, printer, autodiff, interpreter, all recursive over expressions) can run past
Python's recursion limit; a file must be UTF-8 (``read_source``).
"""

from __future__ import annotations

from tile import ast
from tile.errors import Source, Span, TileSyntaxError
from tile.gc_pause import paused_gc
from tile.lexer import Token, tokenize

_AGG = {
    "+": ast.AggOp.SUM,
    "*": ast.AggOp.PROD,
    ">": ast.AggOp.MAX,
    "<": ast.AggOp.MIN,
    "=": ast.AggOp.ASSIGN,
}
_COMB = {"*": ast.CombOp.MUL, "+": ast.CombOp.ADD, "==": ast.CombOp.EQ}


@paused_gc()  # a long program is hundreds of thousands of objects: no cycle hunts meanwhile
def parse(text: str, name: str = "<string>") -> ast.Program:
    """Parse Tile source text into a ``Program``; raises ``TileSyntaxError`` with a location."""
    source = Source(text, name)
    return _Parser(source, tokenize(source)).program()


# Deep enough for any program a person writes (the builtin library nests under 10 levels), shallow
# enough that the deepest accepted expression stays far from Python's default recursion limit of
# 1000 frames in every stage that walks it: about 6 frames a level while parsing, 2-3 in the
# binder, printer and interpreter, more in autodiff, whose gradient expressions nest deeper than
# the expression they differentiate.
MAX_NESTING = 64


def read_source(path: str) -> str:
    """The text of a program file (see ``decode_source``); ``OSError`` is left to the caller."""
    with open(path, "rb") as f:
        return decode_source(f.read(), str(path))


def decode_source(data: bytes, name: str = "<bytes>") -> str:
    """``data`` as UTF-8 text; anything else is a ``TileSyntaxError`` at the line and column of
    the first byte that does not decode. The one place program bytes become text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        good = data[: e.start].decode("utf-8")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        shown = Source(data.decode("utf-8", errors="replace"), name)
        raise TileSyntaxError(
            f"the file is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} cannot be decoded",
            Span(line, col, 1, shown),
            hint="save the program as UTF-8 (Tile source is ASCII outside comments)",
        ) from None
    return text[1:] if text.startswith("\ufeff") else text  # a byte-order mark is not a character


def parse_file(path: str) -> ast.Program:
    return parse(read_source(path), str(path))


def _describe(tok: Token) -> str:
    if tok.kind == "EOF":
        return "end of file"
    return f"'{tok.text}'"


class _Tokens:
    """The token stream: the current token, and expecting or accepting the next one (a located
    ``expected X, found Y`` error otherwise)."""

    def __init__(self, source: Source, tokens: list[Token]):
        self.source = source
        self.toks = tokens
        self.pos = 0

    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def advance(self) -> Token:
        t = self.toks[self.pos]
        if t.kind != "EOF":
            self.pos += 1
        return t

    def error(self, what: str, tok: Token | None = None, hint: str | None = None) -> TileSyntaxError:
        tok = tok or self.tok
        return TileSyntaxError(f"expected {what}, found {_describe(tok)}", tok.span, hint)

    def expect_op(self, text: str, hint: str | None = None) -> Token:
        if not self.tok.is_op(text):
            raise self.error(f"'{text}'", hint=hint)
        return self.advance()

    def accept_op(self, *texts: str) -> Token | None:
        if self.tok.is_op(*texts):
            return self.advance()
        return None

    def expect_kind(self, kind: str, what: str, hint: str | None = None) -> Token:
        if self.tok.kind != kind:
            if kind == "ID" and self.tok.kind == "IDX":
                upper = self.tok.text.capitalize()
                hint = hint or f"tensor and dimension names start with an upper-case letter: '{upper}'"
            raise self.error(what, hint=hint)
        return self.advance()


class _Expressions(_Tokens):
    """Expressions, ``expr`` down to ``primary``: operators by precedence climbing, every node's
    height recorded so that no expression nests past ``MAX_NESTING``."""

    def __init__(self, source: Source, tokens: list[Token]):
        super().__init__(source, tokens)
        self.nesting = 0  # open expr()/unary() calls: bounds this parser's own recursion
        self.depths: dict[int, int] = {}  # id(node) -> height of the tree it roots (leaves: 1)

    def enter(self, tok: Token) -> None:
        """One more level of recursion; past ``MAX_NESTING`` a located error, not a RecursionError."""
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise _too_deep(tok)

    def node(self, e: ast.Expr, tok: Token, *children: ast.Expr) -> ast.Expr:
        """Record the height of ``e``'s tree: ``A + A + ... + A`` nests without parentheses, and
        the binder, printer, autodiff and interpreter recurse over that height."""
        height = 1 + max((self.depths.get(id(c), 1) for c in children), default=0)
        if height > MAX_NESTING:
            raise _too_deep(tok)
        self.depths[id(e)] = height
        return e

    def expr(self) -> ast.Expr:
        self.enter(self.tok)
        cond = self.binary(0)
        if self.tok.is_op("?"):
            q = self.advance()
            then = self.expr()
            self.expect_op(":", hint="the conditional is `C ? A : B`")
            other = self.expr()
            cond = self.node(
                ast.Ternary(cond, then, other, _start_span(cond).to(_end_span(other))), q, cond, then, other
            )
        self.nesting -= 1
        return cond

    # Binary levels from loosest to tightest; non-associative levels take at most one operator.
    _LEVELS: tuple[tuple[tuple[str, ...], bool], ...] = (
        (("|",), True),
        (("^",), True),
        (("&",), True),
        (("==", "!="), False),
        (("<", ">", "<=", ">="), False),
        (("<<", ">>"), True),
        (("+", "-"), True),
        (("*", "/"), True),
    )
    _POLY_LEVEL = 6
    _LEVEL_OF = {op: k for k, (ops, _) in enumerate(_LEVELS) for op in ops}

    def poly(self) -> ast.Expr:
        return self.binary(self._POLY_LEVEL)

    def binary(self, min_level: int) -> ast.Expr:
        """Operators of ``_LEVELS[min_level:]`` by precedence climbing: one Python frame per
        precedence step actually taken, not one per level, keeps ``(((...)))`` cheap to parse."""
        lhs = self.unary()
        while self.tok.kind == "OP" and self._LEVEL_OF.get(self.tok.text, -1) >= min_level:
            level = self._LEVEL_OF[self.tok.text]
            ops, assoc = self._LEVELS[level]
            op = self.advance()
            rhs = self.binary(level + 1)
            lhs = self.node(ast.Binary(op.text, lhs, rhs, _start_span(lhs).to(_end_span(rhs))), op, lhs, rhs)
            if not assoc and self.tok.kind == "OP" and self.tok.text in ops:
                raise TileSyntaxError(
                    f"'{op.text}' and '{self.tok.text}' cannot be chained",
                    self.tok.span,
                    hint="add parentheses, e.g. `(A < B) == C`",
                )
        return lhs

    def unary(self) -> ast.Expr:
        ops: list[Token] = []
        while self.tok.is_op("-", "~"):  # a loop, not recursion: `- - - x` may be long
            ops.append(self.advance())
        operand = self.primary()
        for op in reversed(ops):
            span = op.span.to(_end_span(operand))
            if op.text == "-" and isinstance(operand, ast.IntLit):
                operand = ast.IntLit(-operand.value, span)  # `-3` is one literal, as in the original
            elif op.text == "-" and isinstance(operand, ast.FloatLit):
                text = operand.text[1:] if operand.text.startswith("-") else "-" + operand.text
                operand = ast.FloatLit(text, span)
            else:
                operand = self.node(ast.Unary(op.text, operand, span), op, operand)
        return operand

    def primary(self) -> ast.Expr:
        tok = self.tok
        if tok.kind == "INT":
            self.advance()
            lit = ast.IntLit(int(tok.text), tok.span)
            nxt = self.tok
            if (
                nxt.kind == "IDX"
                and nxt.span.line == tok.span.line
                and nxt.span.col == tok.span.col + tok.span.length
                and not self.peek().is_op("(")
            ):
                self.advance()  # `2i` is 2 * i, as in the original grammar
                two_i = ast.Binary("*", lit, ast.Name(nxt.text, nxt.span), tok.span.to(nxt.span))
                return self.node(two_i, tok, lit)
            return lit
        if tok.kind == "FLOAT":
            self.advance()
            return ast.FloatLit(tok.text, tok.span)
        if tok.kind == "ID":
            self.advance()
            if self.tok.is_op("("):
                raise TileSyntaxError(
                    f"'{tok.text}' is not a function",
                    tok.span,
                    hint="function names are lower-case, e.g. `exp(X)`",
                )
            if self.tok.is_op("["):
                raise TileSyntaxError(
                    f"'{tok.text}[...]' cannot be indexed here",
                    self.tok.span,
                    hint="elementwise statements use whole tensors (`O = A + B;`); index tensors "
                    "in a contraction (`O[i: N] = +(A[i]);`)",
                )
            return ast.Name(tok.text, tok.span)
        if tok.kind == "IDX":
            self.advance()
            if self.accept_op("("):
                args: list[ast.Expr] = []
                if not self.tok.is_op(")"):
                    args.append(self.expr())
                    while self.accept_op(","):
                        args.append(self.expr())
                close = self.expect_op(")")
                return self.node(ast.Call(tok.text, tuple(args), tok.span.to(close.span)), tok, *args)
            return ast.Name(tok.text, tok.span)
        if tok.is_op("("):
            self.advance()
            inner = self.expr()
            self.expect_op(")")
            return inner
        raise self.error("an expression")


class _Contractions(_Expressions):
    """A contraction after its output's name: the output's indices and sizes, the aggregation, the
    combination of its operands, its constraints and suffixes."""

    def contraction(self, name: Token) -> ast.Contraction:
        output, sizes = self.contraction_output(name)
        agg = self.aggop(name)
        operands, comb = self.combination()
        constraints: list[ast.Constraint] = []
        while self.accept_op(","):
            constraints.append(self.constraint())
        default, default_span, no_defract = self.suffixes()
        return ast.Contraction(
            output,
            sizes,
            agg,
            comb,
            operands,
            tuple(constraints),
            default,
            no_defract,
            name.span.to(self.toks[self.pos - 1].span),
            default_span,
        )

    def contraction_output(self, name: Token) -> tuple[ast.TensorRef, tuple[ast.Expr, ...] | None]:
        """``[indices : sizes]`` after the output's name; no sizes is None (``O[]`` is 0-D)."""
        self.expect_op("[")
        indices: list[ast.Expr] = []
        if not self.tok.is_op(":", "]"):
            indices.append(self.poly())
            while self.accept_op(","):
                indices.append(self.poly())
        sizes: list[ast.Expr] | None = None
        if self.accept_op(":"):
            sizes = []
            if not self.tok.is_op("]"):
                sizes.append(self.expr())
                while self.accept_op(","):
                    sizes.append(self.expr())
        close = self.expect_op("]")
        if sizes is None and not indices:
            sizes = []  # `O[]` is 0-D
        output = ast.TensorRef(name.text, tuple(indices), name.span.to(close.span))
        return output, tuple(sizes) if sizes is not None else None

    def aggop(self, name: Token) -> ast.AggOp:
        """``= op`` before the combination's ``(``."""
        if self.tok.is_op("==") and self.peek().is_op("("):
            agg_tok = self.advance()  # `==(` is `= =(`
        else:
            self.expect_op("=")
            agg_tok = self.tok
            if not (agg_tok.kind == "OP" and agg_tok.text in _AGG and self.peek().is_op("(")):
                raise self.error(
                    "an aggregation '+(', '*(', '>(', '<(' or '=('",
                    agg_tok,
                    hint=f"a contraction aggregates its values, e.g. `{name.text}[...] = +(A[...])`; "
                    f"write `{name.text} = ...` (no brackets) for an elementwise statement",
                )
            self.advance()
        return ast.AggOp.ASSIGN if agg_tok.text == "==" else _AGG[agg_tok.text]

    def combination(self) -> tuple[tuple[ast.TensorRef, ...], ast.CombOp]:
        self.expect_op("(")
        operands = [self.operand()]
        comb = ast.CombOp.NONE
        if self.tok.kind == "OP" and self.tok.text in _COMB:
            comb = _COMB[self.advance().text]
            operands.append(self.operand())
            if self.tok.is_op("?"):
                if comb is not ast.CombOp.EQ:
                    raise TileSyntaxError(
                        "the conditional form is `A[...] == B[...] ? C[...]`",
                        self.tok.span,
                        hint="compare the operands with `==`",
                    )
                self.advance()
                operands.append(self.operand())
                comb = ast.CombOp.COND
        elif not self.tok.is_op(")"):
            raise self.error(
                "')' or a combination '*', '+' or '=='",
                hint="a contraction combines at most two tensors with `*` or `+` "
                "(or `A == B ? C`); do other arithmetic in an elementwise statement",
            )
        self.expect_op(")")
        return tuple(operands), comb

    def suffixes(self) -> tuple[str | None, Span, bool]:
        """``default T`` and ``no_defract``: the default's name and span, and no_defract."""
        default, default_span, no_defract = None, ast._NO_SPAN, False
        while self.tok.kind == "KEYWORD" and self.tok.text in ("default", "no_defract"):
            kw = self.advance()
            if kw.text == "no_defract":
                no_defract = True
            else:
                d = self.expect_kind("ID", "the name of the default tensor")
                default, default_span = d.text, d.span
        return default, default_span, no_defract

    def operand(self) -> ast.TensorRef:
        if self.tok.kind in ("INT", "FLOAT"):
            raise self.error(
                "a tensor like `A[i, j]`",
                hint="constants cannot appear inside a contraction; scale the result "
                "in an elementwise statement",
            )
        name = self.expect_kind("ID", "a tensor like `A[i, j]`")
        if not self.tok.is_op("["):
            raise self.error(
                "'['",
                hint=f"tensors in a contraction are indexed: `{name.text}[i, ...]`; "
                f"a 0-D tensor is `{name.text}[]`",
            )
        self.advance()
        indices: list[ast.Expr] = []
        if not self.tok.is_op("]"):
            indices.append(self.poly())
            while self.accept_op(","):
                indices.append(self.poly())
        close = self.expect_op("]")
        return ast.TensorRef(name.text, tuple(indices), name.span.to(close.span))

    def constraint(self) -> ast.Constraint:
        poly = self.poly()
        if self.tok.is_op("<=", ">", ">="):
            raise TileSyntaxError(
                f"constraints are written `poly < bound`, not with '{self.tok.text}'",
                self.tok.span,
                hint="`j < N` means 0 <= j < N; write `j < N + 1` for j <= N",
            )
        self.expect_op("<", hint="a constraint is `poly < bound`, meaning 0 <= poly < bound")
        bound = self.poly()
        return ast.Constraint(poly, bound, _start_span(poly).to(_end_span(bound)))


class _Parser(_Contractions):
    """A whole program: the header's inputs and outputs, then the statements of its body."""

    def program(self) -> ast.Program:
        if not (self.tok.kind == "KEYWORD" and self.tok.text == "function"):
            raise self.error("'function'", hint="a Tile program is `function (Inputs) -> (Outputs) { ... }`")
        self.advance()
        self.expect_op("(")
        inputs: list[ast.Input] = []
        if not self.tok.is_op(")"):
            inputs.append(self.input())
            while self.accept_op(","):
                inputs.append(self.input())
        self.expect_op(")")
        self.expect_op("->", hint="the inputs are followed by `-> (Outputs)`")
        self.expect_op("(")
        outputs = [self.output()]
        while self.accept_op(","):
            outputs.append(self.output())
        self.expect_op(")")
        self.expect_op("{")
        stmts: list[ast.Statement] = []
        while not self.tok.is_op("}"):
            if self.tok.kind == "EOF":
                raise self.error(
                    "'}' to close the function body", hint="the function body runs from '{' to a matching '}'"
                )
            stmt = self.statement()
            if stmt is not None:
                stmts.append(stmt)
        self.advance()
        if self.tok.kind != "EOF":
            raise self.error(
                "end of file after the function body",
                hint="a file holds one function; remove what follows its closing '}'",
            )
        return ast.Program(tuple(inputs), tuple(outputs), tuple(stmts), self.source)

    def input(self) -> ast.Input:
        name = self.expect_kind("ID", "an input name")
        if not self.accept_op("["):
            return ast.Input(name.text, None, name.span)
        dims: list[Token] = []
        if not self.tok.is_op("]"):
            dims.append(self.expect_kind("ID", "a dimension name"))
            while self.accept_op(","):
                dims.append(self.expect_kind("ID", "a dimension name"))
        close = self.expect_op("]", hint="input dimensions are names, e.g. `I[N, M]`")
        return ast.Input(
            name.text, tuple(d.text for d in dims), name.span.to(close.span), tuple(d.span for d in dims)
        )

    def output(self) -> ast.Output:
        if self.tok.is_op("["):
            raise self.error(
                "an output name",
                hint="outputs have no dimensions in the header; they are given where the output is computed",
            )
        name = self.expect_kind("ID", "an output name")
        if self.tok.is_op("["):
            raise self.error(
                "',' or ')'",
                hint="outputs have no dimensions in the header; they are given where the output is computed",
            )
        return ast.Output(name.text, name.span)

    def statement(self) -> ast.Statement | None:
        while self.tok.is_op("[["):
            self.attribute()
        if self.accept_op(";"):
            return None
        if self.tok.kind == "IDX" and self.peek().is_op("=", "["):
            raise TileSyntaxError(
                f"'{self.tok.text}' cannot be assigned: it is an index name",
                self.tok.span,
                hint=f"tensor names start with an upper-case letter: '{self.tok.text.capitalize()}'",
            )
        name = self.expect_kind("ID", "a statement (`Name = ...;` or `Name[...] = op(...);`)")
        if self.tok.is_op("["):
            stmt: ast.Statement = self.contraction(name)
        elif self.tok.is_op("="):
            self.advance()
            expr = self.expr()
            stmt = ast.Assignment(name.text, expr, name.span.to(_end_span(expr)))
        else:
            raise self.error("'=' or '['")
        if not self.tok.is_op(";"):
            raise self.error(
                "';' at the end of the statement", hint="every Tile statement ends with a semicolon"
            )
        self.advance()
        return stmt

    def attribute(self) -> None:
        self.expect_op("[[")
        self.expect_kind("IDX", "an attribute name")
        if self.accept_op("("):
            if self.tok.kind not in ("ID", "IDX"):
                raise self.error("an attribute argument")
            self.advance()
            while self.accept_op(","):
                if self.tok.kind not in ("ID", "IDX"):
                    raise self.error("an attribute argument")
                self.advance()
            self.expect_op(")")
        self.expect_op("]]")


def _too_deep(tok: Token) -> TileSyntaxError:
    return TileSyntaxError(
        f"expression nested more than {MAX_NESTING} levels deep",
        tok.span,
        hint="name the inner parts in statements of their own, e.g. `T = (...); O = T * T;`",
    )


def _start_span(e: ast.Expr) -> Span:
    while isinstance(e, (ast.Binary, ast.Ternary)):
        e = e.lhs if isinstance(e, ast.Binary) else e.cond
    return e.span


def _end_span(e: ast.Expr) -> Span:
    while isinstance(e, (ast.Binary, ast.Ternary, ast.Unary)):
        e = e.rhs if isinstance(e, ast.Binary) else e.other if isinstance(e, ast.Ternary) else e.operand
    return e.span
