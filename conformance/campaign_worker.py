"""One chunk of a campaign (``conformance.campaign``), run in a worker process without pytest.

A chunk is one family on one target: ``examples`` examples drawn by Hypothesis from the chunk's own
seed (no example database), each checked by ``test_conformance.check`` exactly as the suite checks
it (validity, tolerance, refusals, expected differences), and counted in a fresh
``report.Stats``. A failing example stops the chunk (Hypothesis shrinks it first); its folder is
bisected (``conformance.bisect``) where it was written, then sent back as bytes with its
signature, so a worker on another machine (Ray) needs no shared disk.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from conformance import report, targets


@dataclass(frozen=True)
class Chunk:
    family: str
    target: str
    index: int  # its place in the campaign's plan (the plan, not the worker, decides the seed)
    examples: int
    seed: int
    distinguish: int = 0  # coverage's distinguishing examples sought per operation (0: none)


@dataclass
class Found:
    """A failure of a chunk: its folder's files and what it is (``signature``)."""

    folder: str  # the folder's name
    files: dict[str, bytes]
    family: str
    target: str
    problem: str
    kind: str  # "wrong answer", "raised <Error>", "missing refusal", ...
    culprit: str  # from bisect: "pass <name>", "lowering", "code generator", ... ("" where none)
    operations: str  # the aggregations and builtins the shrunk program uses

    @property
    def signature(self) -> tuple[str, str, str, str]:
        return (self.family, self.culprit, self.kind, self.operations)


def run_chunk(chunk: Chunk) -> dict:
    """Run one chunk; returns ``{"chunk", "stats" (Stats.to_json), "found", "seconds", "skipped"}``."""
    import pytest
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    from backends import registry
    from conformance import strategies
    from conformance import test_conformance as suite
    from tile.errors import TileIndexWarning

    start = time.perf_counter()
    saved = report.STATS, report.FAILURES
    tmp = Path(tempfile.mkdtemp(prefix="tile-campaign-"))
    report.STATS, report.FAILURES = report.Stats(), tmp
    report.STATS.coverage.k = chunk.distinguish
    key = (chunk.family, chunk.target)
    skipped = ""
    found: list[Found] = []
    try:
        subject = targets.Subject(chunk.target, registry.get(chunk.target))
        passes = chunk.family == "optimized"

        def body(case):
            suite.check(case, subject, passes=passes)

        test = settings(
            max_examples=chunk.examples,
            database=None,
            deadline=None,
            derandomize=False,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )(given(strategies.FAMILIES[chunk.family]())(body))
        test = with_seed(chunk.seed)(test)
        report.STATS.current = key
        failed, message = False, ""
        try:
            if not passes:
                suite.compiled(subject)
            if chunk.family == "gradients":
                suite.needs(subject, _float64(), "gradient programs are checked in float64")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TileIndexWarning)
                test()
        except pytest.skip.Exception as e:
            skipped = str(e)
        except Exception as e:  # a failing example (or several): the folders its message names are kept
            failed, message = True, _message(e)
        report.STATS.current = None
        report.STATS.finish_test(key, failed, time.perf_counter() - start, message)
        found = [_found(Path(path), chunk) for path in _kept(tmp)]
        stats = report.STATS.to_json()
    finally:
        report.STATS, report.FAILURES = saved
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "chunk": asdict(chunk),
        "stats": stats,
        "found": [asdict(f) for f in found],
        "seconds": time.perf_counter() - start,
        "skipped": skipped,
    }


def _float64():
    from tile.dtypes import DType

    return DType.FLOAT64


def _message(error: BaseException) -> str:
    """Every message of a (possibly grouped) failure, so ``finish_test`` keeps each named folder."""
    parts, stack = [], [error]
    while stack:
        e = stack.pop()
        stack.extend(getattr(e, "exceptions", ()))
        parts.append(str(e))
    return "\n".join(parts)


def _kept(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


def _found(folder: Path, chunk: Chunk) -> Found:
    failure = report.read_failure(folder)
    problem = failure.meta["problem"]
    return Found(
        folder=folder.name,
        files={p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()},
        family=chunk.family,
        target=failure.meta["target"],
        problem=problem,
        kind=kind_of(problem, failure.meta),
        culprit=culprit_of(folder),
        operations=operations(statement_of(failure.source, problem)),
    )


def kind_of(problem: str, meta: dict) -> str:
    """What went wrong, in a word or two: a wrong answer, a crash (with its exception class), an
    answer or another error where the interpreter refuses the program."""
    if "refusal" in meta:
        return "answered a refused program" if problem.rstrip().endswith("answered") else "refused otherwise"
    crashed = re.search(r" raised (\w+)", problem)
    if crashed:
        return f"raised {crashed.group(1)}"
    if problem.startswith("outputs differ") or ": expected " in problem.split("elements differ")[0]:
        return "wrong outputs or types"
    return "wrong answer"


_CULPRIT = re.compile(r"^culprit: (.*)$", re.M)


def culprit_of(folder: Path) -> str:
    """The first bad step ``conformance.bisect`` names, shortened: ``pass NAME``, ``lowering``,
    ``code generator`` or ``whole-program device``; "" where it cannot tell or nothing differs."""
    from conformance import bisect

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                bisect.main([str(folder), "--diff-lines", "1"])
    except Exception:  # noqa: BLE001 - a signature without a culprit is still a signature
        return ""
    found = _CULPRIT.search(out.getvalue())
    if found is None:
        return ""
    text = found.group(1)
    step = re.match(r"pass step '([^']+)' of config (\S+) \(pass (\w+)", text)
    if step:
        return f"pass {step.group(3)} ({step.group(2)})"
    if text.startswith("the lowering"):
        return "lowering"
    if "code generator" in text:
        return "code generator"
    return "whole-program device" if "answers differently" in text else text[:60]


def statement_of(source: str, problem: str) -> str:
    """The statement computing the first output the problem names (``O_sum: 4 of 5 elements
    differ``), else the whole program: a sweep's one wrong output, not its fifty others."""
    named = re.match(r"(\w+): ", problem)
    if named:
        for stmt in source.split("{", 1)[-1].split(";"):
            if re.match(rf"\s*{named.group(1)}\s*[\[=]", stmt):
                return "-> {" + stmt.strip() + ";"
    return source


_AGG = re.compile(r"\]\s*=\s*([+*<>=])\(")
_CALL = re.compile(r"\b([a-z_][a-z0-9_]*)\(")
_OPS = re.compile(r"(==|!=|<=|>=|<<|>>|&&|\|\||[-+*/%<>&|^?~!])")


def operations(source: str) -> str:
    """The operations a program uses: its aggregations (``agg+``), builtins and elementwise
    operators, sorted (a shrunk failing program holds little else)."""
    body = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    body = body.split("->", 1)[-1]
    aggs = {f"agg{a}" for a in _AGG.findall(body)}
    calls = set(_CALL.findall(body))
    stripped = _AGG.sub("](", body)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # index polynomials are not operations
    ops = set(_OPS.findall(stripped.split("{", 1)[-1]))
    return " ".join(sorted(aggs) + sorted(calls) + sorted(ops)) or "copy"
