"""``plaidml.llvm_cpu.0``: PlaidML 0.7.0 running whole Tile programs, as a ``ProgramDevice``.

The program arrives as Tile source (stage ``tile``) and runs in the worker process of
``backends.plaidml.worker`` (PlaidML aborts and hangs on some programs; the next call starts a
fresh worker). Two things are said PlaidML's way before it sees them, because they are spelling,
not meaning:

* every binary operation of an elementwise statement is parenthesized: PlaidML's precedence of
  ``|`` and ``^`` is not C's (docs/semantics.md §10.22), and explicit grouping reads the same in
  both;
* a 0-D input the program uses as a size (§6.3.1) is bound as a ``plaidml.Integer``, the only
  size PlaidML takes (§10.43).

A program calling a builtin PlaidML 0.7 never had (``differences.NOT_IN_PLAIDML``: ``round_tf32``)
is refused before PlaidML sees it, with a ``TileBackendError`` at the call (§10.45), not an abort.

Everything else is PlaidML's own answer, checked by ``ProgramRun`` (names, shapes, dtypes) and by
the conformance suite (values). Where PlaidML differs from the interpreter for a reason
docs/semantics.md §10 documents, ``known_difference`` names it (``backends.plaidml.differences``).
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from backends.hal import Capabilities, ProgramDevice
from backends.plaidml import differences as diff
from backends.plaidml.worker import PeerError, PlaidML
from tile import ast
from tile.dtypes import DType
from tile.errors import TileBackendError, TileError, TileInputError, TileLimitError

REMEMBERED = 4  # programs whose last inputs and outcome known_difference can look up
HINTS = {
    "error": "PlaidML refused a program Tile accepts; docs/semantics.md §10 lists the known cases",
    "abort": "PlaidML 0.7 aborts on some valid programs (docs/semantics.md §10 lists the known cases); "
    "the next call starts a fresh PlaidML process",
    "hang": "PlaidML gave no answer in time and was stopped; the next call starts a fresh PlaidML process "
    "(PlaidMLDevice(timeout=...) gives it longer)",
}


@dataclass
class _Run:
    """The last call of one program: its inputs and how PlaidML answered (a ``differences``
    outcome: ABORT, HANG, ERROR, DTYPE, or VALUES for outputs of the expected names and types)."""

    inputs: dict[str, np.ndarray]
    outcome: str


class PlaidMLDevice(ProgramDevice):
    """PlaidML 0.7.0 on its ``llvm_cpu.0`` device, in a worker process (see the module)."""

    id = "plaidml.llvm_cpu.0"
    description = "PlaidML 0.7.0 on its llvm_cpu.0 device, in a worker process (whole programs)"
    stage = "tile"
    # PlaidML has every Tile dtype but bfloat16; the operations it aborts on are known differences
    # (§10.28 ...).
    capabilities = Capabilities(frozenset(DType) - {DType.BFLOAT16}, fp64=True, fp16=True)

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self._worker = PlaidML(timeout=timeout)
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    def execute(
        self,
        program: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, tuple[DType, tuple[int, ...]]],
    ) -> dict[str, np.ndarray]:
        from tile.parser import parse
        from tile.size_inputs import size_uses

        prog = parse(program)
        sizes = size_uses(prog)
        # A size is a 0-D input; ProgramRun may hand one over as a 1-element array.
        inputs = {k: np.reshape(v, ()) if k in sizes and np.size(v) == 1 else v for k, v in inputs.items()}
        feed = {k: int(v.item()) if k in sizes and np.size(v) == 1 else v for k, v in inputs.items()}
        if missing := diff.calls_not_in_plaidml(prog):  # PlaidML would abort on it (§10.25)
            self._remember(program, inputs, diff.ERROR)
            raise TileBackendError(
                f"{self.id} cannot run this program: PlaidML 0.7 has no builtin '{missing[0].fn}'",
                missing[0].span,
                hint="docs/semantics.md §10.45; run it on another device (python -m tile devices)",
            )
        try:
            got = self._worker.run(plaidml_source(prog), feed)
        except PeerError as e:
            self._remember(program, inputs, e.kind)
            refusal = interpreter_refusal(prog, inputs)
            if refusal is not None:  # not PlaidML's failure: the program is refused (§10.3 ...)
                raise refusal from e
            raise TileBackendError(f"{self.id}: {e}", None, hint=HINTS[e.kind]) from e
        typed = set(got) == set(outputs) and all(
            got[n].dtype == dtype.numpy and got[n].shape == shape for n, (dtype, shape) in outputs.items()
        )
        self._remember(program, inputs, diff.VALUES if typed else diff.DTYPE)
        return got

    def _remember(self, program: str, inputs: Mapping, outcome: str) -> None:
        self._runs[program] = _Run(dict(inputs), outcome)
        self._runs.move_to_end(program)
        while len(self._runs) > REMEMBERED:
            self._runs.popitem(last=False)

    def known_difference(self, source: str, problem: str, inputs: Mapping | None = None) -> str | None:
        """The documented differences (docs/semantics.md §10) that explain ``problem`` on
        ``source``, joined by "; ", or None. Most depend on the inputs' dtypes (and some on
        values): ``inputs``, else those of the last call of this program on this device; without
        either only what the text alone shows is named. Only differences that surface the way
        ``problem`` (else the last call) shows count: an abort is not explained by a rounding."""
        from tile.parser import parse
        from tile.printer import format_program

        try:
            prog = parse(source)
        except TileError:
            return None
        run = self._runs.get(format_program(prog))
        if inputs is None and run is not None:
            inputs = run.inputs
        outcome = outcome_of(problem) or (run.outcome if run is not None else None)
        found = differences_of(prog, inputs, outcome)
        reasons = [str(d) for d in found if outcome is None or outcome in d.shows]
        return "; ".join(dict.fromkeys(reasons)) or None

    def close(self) -> None:
        self._worker.close()


def outcome_of(problem: str) -> str | None:
    """How a conformance problem says PlaidML answered: ABORT, HANG, ERROR (from the worker's
    ``PeerError``), DTYPE (outputs of other dtypes or shapes), VALUES, or None where it cannot tell."""
    for kind in (diff.ABORT, diff.HANG, diff.ERROR):
        if f"PlaidML {kind}:" in problem:
            return kind
    if "elements differ" in problem:  # (conformance.report.compare)
        return diff.VALUES
    if "the program makes" in problem or re.search(r"expected \w+\[[\d, ]*\], got \w+\[", problem):
        return diff.DTYPE  # (backends.program.check_outputs, conformance.report.compare)
    return None


def interpreter_refusal(prog: ast.Program, inputs: Mapping) -> TileError | None:
    """The located error the interpreter refuses ``prog`` with for ``inputs`` at run time (an
    empty index space, say, on which PlaidML aborts: §10.3), or None where it runs it. Its own
    resource bound (``TileLimitError``) is no refusal, nor an input error (``tile.compile`` checked
    the inputs; one here is an artifact of how they were handed over)."""
    import ref_interp  # the oracle decides what a program means, PlaidML's failure or not

    try:
        ref_interp.run(prog, inputs)
    except (TileLimitError, TileInputError):  # (inputs were checked before the device got them)
        return None
    except TileError as e:
        return e
    return None


def differences_of(prog: ast.Program, inputs: Mapping | None, outcome: str | None) -> list:
    """Every documented difference ``prog`` can show on ``inputs`` (None: only what the source
    shows). With ``outcome`` ABORT, §10.37 (an abort on some valid contractions) is considered too."""
    import ref_interp  # the oracle, for values the differences depend on
    from tile.bind import bind
    from tile.inputs import input_types
    from tile.typed import TContraction

    found = diff.source_differences(prog)
    if inputs is None:
        return found
    try:
        bound = bind(prog, input_types(prog, inputs), inputs)
    except TileError:
        return found
    shown = [s.name for s in prog.stmts if s.name not in diff.prng_handles(prog)]  # handles are opaque
    everything = dataclasses.replace(prog, outputs=tuple(ast.Output(n) for n in shown))
    try:
        values = {**inputs, **ref_interp.run(everything, inputs)}
    except TileError as e:
        values = None  # value-dependent differences then count as possible
        found += diff.refusal_differences(e)
    found += diff.program_differences(bound, values) + diff.simple_reduce_differences(prog, bound)
    if outcome in (None, diff.ABORT):
        found += [d for c in bound.stmts if isinstance(c, TContraction) if (d := diff.unimodular_abort(c))]
    return found


# ------------------------------------------------------------------------------ PlaidML's spelling


def plaidml_source(prog: ast.Program) -> str:
    """``prog`` as PlaidML 0.7 reads it meaning what we mean: ``tile.printer``'s text, with every
    binary and conditional operation of an elementwise statement in parentheses (§10.22)."""
    from tile.printer import format_program, format_statement

    head = format_program(dataclasses.replace(prog, stmts=())).splitlines()[0]  # `function (..) -> (..) {`
    body = [
        f"    {s.name} = {_grouped(s.expr)};"
        if isinstance(s, ast.Assignment)
        else f"    {format_statement(s)}"
        for s in prog.stmts
    ]
    return "\n".join([head, *body, "}"]) + "\n"


def _grouped(e: ast.Expr) -> str:
    if isinstance(e, ast.IntLit | ast.FloatLit):
        text = str(e.value) if isinstance(e, ast.IntLit) else e.text
        return f"({text})" if text.startswith("-") else text
    if isinstance(e, ast.Name):
        return e.name
    if isinstance(e, ast.Call):
        return f"{e.fn}({', '.join(_grouped(a) for a in e.args)})"
    if isinstance(e, ast.Unary):
        return f"{e.op}({_grouped(e.operand)})"
    if isinstance(e, ast.Binary):
        return f"({_grouped(e.lhs)} {e.op} {_grouped(e.rhs)})"
    if isinstance(e, ast.Ternary):
        return f"({_grouped(e.cond)} ? {_grouped(e.then)} : {_grouped(e.other)})"
    raise AssertionError(f"unknown expression node {e!r}")
