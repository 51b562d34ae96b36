"""The regression corpus ``conformance/regressions/``: failures kept, replayed on every target.

An entry is a folder ``regressions/<name>/`` laid out like a failure folder (``report.py``), so
``conformance.reproduce`` and ``conformance.bisect`` take it as they are:

* ``case.tile``: the program, headed by ``//`` lines saying where it came from;
* ``inputs.npz``: its inputs;
* ``expected.npz``: the **interpreter's** outputs, computed when the entry was promoted (a failing
  target's outputs are never kept as the truth); empty where the interpreter refuses the program;
* ``case.json``: ``family`` (the family that found it), ``target`` and ``problem`` (where and how
  it failed then: history, not a property of the entry), ``tolerance`` (the family's rule in
  native mode), ``passes`` (replay every config's passes through the Stripe interpreter too, as the
  ``optimized`` family does), ``refusal`` (the interpreter's error, where it refuses the program),
  ``origin`` and ``note``.

Nothing target-specific is kept: no ``got.npz``, no user config. What is stored must stay small:
an entry over ``LIMIT_BYTES`` is refused (``TooLarge``, naming its size and ``--max-kib``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from conformance import report
from conformance.report import Failure, Tolerance
from conformance.targets import example_digest

CORPUS = Path(__file__).resolve().parent / "regressions"
LIMIT_BYTES = 64 * 1024  # the most one entry may take on disk (program, inputs and expected outputs)
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_.-")


class PromoteError(Exception):
    """Something ``promote`` cannot keep: the message says what and how to get past it."""


class TooLarge(PromoteError):
    pass


class AlreadyKept(PromoteError):
    """The corpus holds this program and inputs already (under the name the message gives)."""


@dataclass
class Entry:
    """One regression, loaded (``failure`` is it read as a failure folder)."""

    name: str
    failure: Failure

    @property
    def source(self) -> str:
        return self.failure.source

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return self.failure.inputs

    @property
    def meta(self) -> dict:
        return self.failure.meta

    @property
    def passes(self) -> bool:
        return bool(self.meta.get("passes"))

    def case(self):
        """The entry as a ``strategies.Case`` for ``test_conformance.check`` (family
        ``regressions``, or ``products``, whose tolerance ``check`` derives from the notes)."""
        from conformance.strategies import Case

        rule = self.meta.get("rule") or {}
        tol = self.failure.tol
        family = "products" if self.meta["family"] == "products" else "regressions"
        return Case(
            family,
            program_text(self.source),
            self.inputs,
            exact=rule.get("exact", tol.exact),
            ulps=rule.get("ulps", tol.ulps),
            length=rule.get("length", tol.length),
            notes=dict(rule.get("notes", {})),
        )

    def digest(self) -> str:
        return example_digest(program_text(self.source), self.inputs)


def program_text(source: str) -> str:
    """``source`` without the ``//`` lines heading it (a failure's or an entry's header)."""
    lines = source.splitlines()
    while lines and (lines[0].startswith("//") or not lines[0].strip()):
        lines.pop(0)
    return "\n".join(lines).rstrip() + "\n"


def entries(corpus: Path = CORPUS) -> list[Entry]:
    """Every entry of the corpus, by name. A folder that is not an entry is an error naming it."""
    out = []
    for folder in sorted(p for p in corpus.glob("*") if p.is_dir() and not p.name.startswith((".", "_"))):
        try:
            out.append(Entry(folder.name, report.read_failure(folder)))
        except report.NotAFailure as e:
            raise PromoteError(f"the regression corpus holds a broken entry: {e}") from None
    return out


def interpreter_answer(source: str, inputs: dict[str, np.ndarray]) -> tuple[dict, str | None]:
    """The interpreter's outputs (native mode), or ``({}, refusal)`` where it refuses the program
    for these inputs (``report.refusal_text``). A program that does not parse or bind is no
    regression a target can show: ``PromoteError``."""
    import ref_interp
    import tile
    from tile.inputs import input_types

    try:
        prog = tile.parse(source)
        bound = tile.bind(prog, input_types(prog, inputs), inputs)
    except tile.TileError as e:
        raise PromoteError(
            f"the program does not bind to its inputs, so no target ever runs it:\n{e}"
        ) from None
    try:
        return ref_interp.run(bound, inputs), None
    except tile.TileError as e:
        return {}, report.refusal_text(e)


def oracle_change(entry: Entry) -> str | None:
    """How the interpreter's answer now differs from the one stored at promotion, or None."""
    want, refusal = interpreter_answer(entry.source, entry.inputs)
    stored = entry.meta.get("refusal")
    if refusal != stored:
        now = f"refuses it with {refusal}" if refusal else "answers"
        return f"it {now} (stored: {stored or 'an answer'})"
    return report.compare(entry.failure.want, want, Tolerance()) if refusal is None else None


def _check_name(name: str) -> str:
    if not name or not set(name) <= _NAME_CHARS or name[0] in ".-":
        raise PromoteError(
            f"'{name}' is not a usable entry name: use lower-case letters, digits, '_', '.' and '-'"
        )
    return name


def write(
    name: str,
    source: str,
    inputs: dict[str, np.ndarray],
    *,
    family: str,
    target: str,
    problem: str,
    tolerance: Tolerance,
    origin: str,
    note: str = "",
    passes: bool = False,
    rule: dict | None = None,
    corpus: Path = CORPUS,
    limit: int = LIMIT_BYTES,
    replace: bool = False,
) -> Path:
    """Keep one program and its inputs as entry ``name``, with the interpreter's answer. ``rule``:
    the ``strategies.Case`` fields the replay compares by (``exact``, ``ulps``, ``length``,
    ``notes``; by default ``tolerance``'s). Refused: a name taken by another program, the same
    program and inputs under another name, an entry over ``limit`` bytes. Returns its folder."""
    body = program_text(source)
    want, refusal = interpreter_answer(body, inputs)
    digest = example_digest(body, inputs)
    folder = corpus / _check_name(name)
    if not replace:
        for e in entries(corpus):
            if e.digest() == digest:
                raise AlreadyKept(f"the corpus holds this program and inputs as '{e.name}'")
        if folder.exists():
            raise PromoteError(f"the corpus already has an entry '{name}': give another --name")
    header = [f"// regression {name}: found by the {family} family on {target}"]
    header += [f"// {line}" for line in (problem.splitlines()[:1] + note.splitlines()) if line]
    header.append(f"// origin: {origin}")
    meta = {
        "family": family,
        "target": target,
        "problem": problem,
        "tolerance": asdict(tolerance),
        "passes": passes,
        "rule": rule or {"exact": tolerance.exact, "ulps": tolerance.ulps, "length": tolerance.length},
        "origin": origin,
        "note": note,
        "digest": digest,
    }
    if refusal is not None:
        meta["refusal"] = refusal
    staging = corpus / f".{name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        (staging / "case.tile").write_text("\n".join(header) + "\n" + body)
        np.savez_compressed(staging / "inputs.npz", **inputs)
        np.savez_compressed(staging / "expected.npz", **want)
        (staging / "case.json").write_text(json.dumps(meta, indent=2) + "\n")
        size = sum(p.stat().st_size for p in staging.iterdir())
        if size > limit:
            raise TooLarge(
                f"entry '{name}' would take {size / 1024:.1f} KiB, over the {limit / 1024:.0f} KiB limit: "
                "shrink the example (Hypothesis's shrunk failures are small) or pass --max-kib N"
            )
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def product_length(failure: Failure) -> int:
    """The reduction length of a ``products`` failure, read back from its tolerance: that family
    records ``precision.product_tolerance(mode, dtype, K, max S)``, whose bound is linear in K."""
    from conformance import precision

    dtype = _float_dtype(failure.inputs)
    tol = failure.tol
    size = precision.magnitude(program_text(failure.source), failure.inputs)
    for mode in precision.MODES:
        u = precision.unit_roundoff(mode, dtype)
        if u == tol.eps:
            acc = precision.accumulation_roundoff(mode, dtype)
            bound = tol.ulps * u / max(size, np.finfo(np.float64).tiny)
            return max(1, round((bound / 2 - precision.TERMS * u) / acc))
    raise PromoteError(f"{failure.folder}: its tolerance matches no precision mode's products")


def _float_dtype(inputs: dict[str, np.ndarray]):
    from tile.dtypes import DType

    floats = [DType.of(a.dtype) for a in inputs.values() if DType.of(a.dtype).is_float]
    return floats[0] if floats else DType.FLOAT32
