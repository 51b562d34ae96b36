"""Failure artifacts and the end-of-session summary of the conformance suite.

A failing example (a mismatch, or the target raising) is written to
``<failures>/<family>-<target>-<hash>/``: ``case.tile`` (the program, headed by comments saying how
it failed and how to rerun it), ``inputs.npz``, ``expected.npz`` (the interpreter's outputs),
``got.npz`` (the target's, when it produced any) and ``case.json`` (the tolerance and the problem).
``python -m conformance.reproduce DIR [--target ID]`` reruns it and diffs against expected.npz.

``check`` writes a directory on every failing call, so directories pile up while Hypothesis
shrinks; when the test's report is made (``prune``), those its final message does not name are
removed, leaving the shrunk example(s) Hypothesis reports. The hash is of the program and inputs,
so a rerun of the same example overwrites its directory.

``STATS`` counts, per family and target, examples compared, examples not run (and why), failing
tests and seconds; under pytest-xdist each worker sends its counts to the controller, which merges
them before printing the summary.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from conformance import onnx_nodes, targets
from conformance.coverage import Coverage
from conformance.targets import example_digest
from tile.dtypes import BFLOAT16_NUMPY
from tile.inputs import from_npz

FAILURES = Path(__file__).resolve().parent / "failures"  # --conformance-failures changes it


@dataclass
class Tolerance:
    """How closely a target must match: exactly, or within ``ulps * eps * length * max(1, |want|)``
    (``relative=False``: ``ulps * eps * length``, a bound that already holds the data's magnitude,
    as ``conformance.precision`` derives for matrix products)."""

    exact: bool = True
    ulps: float = 0.0
    length: int = 1
    eps: float = 0.0  # epsilon of the coarsest float type in the program
    relative: bool = True


def compare(want: dict, got: dict, tol: Tolerance) -> str | None:
    """The first difference between the interpreter's outputs and a target's, or None."""
    if set(got) != set(want):
        return f"outputs differ: expected {sorted(want)}, got {sorted(got)}"
    for name in want:
        w, g = np.asarray(want[name]), np.asarray(got[name])
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{name}: expected {w.dtype}{list(w.shape)}, got {g.dtype}{list(g.shape)}"
        where = differing(w, g, tol)
        if where:
            first = ", ".join(element_text(name, ix, w, g) for ix in where[:3])
            more = f" (and {len(where) - 3} more)" if len(where) > 3 else ""
            return f"{name}: {len(where)} of {w.size} elements differ: {first}{more}"
    return None


def mismatches(w: np.ndarray, g: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Where ``g`` differs from ``w`` (same shape and dtype) under ``tol``: a boolean array, so that
    ``compare`` and ``conformance.bisect`` (which lists more of them) agree on what differs."""
    if tol.exact or not _is_float(w):
        return ~((g == w) | (_isnan(g) & _isnan(w)))
    w64, g64 = w.astype(np.float64), g.astype(np.float64)
    limit = tol.ulps * tol.eps * max(tol.length, 1) * (np.maximum(1.0, np.abs(w64)) if tol.relative else 1.0)
    with np.errstate(invalid="ignore"):  # inf - inf: the == term decides
        close = np.abs(g64 - w64) <= limit
    return ~(close | (np.isnan(g64) & np.isnan(w64)) | (g64 == w64))


def differing(w: np.ndarray, g: np.ndarray, tol: Tolerance) -> list[tuple[int, ...]]:
    """The indexes of the elements that differ (``mismatches``), in row-major order."""
    bad = mismatches(w, g, tol)
    if not w.ndim:
        return [()] if bad.any() else []
    return [tuple(int(i) for i in ix) for ix in zip(*np.nonzero(bad))]


def element_text(name: str, ix: tuple[int, ...], w: np.ndarray, g: np.ndarray) -> str:
    """One differing element as the suite and ``bisect`` show it."""
    return f"{name}{list(ix)}: expected {w[ix].tolist()!r}, got {g[ix].tolist()!r}"


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" or a.dtype == BFLOAT16_NUMPY  # (ml_dtypes' bfloat16 is kind "V")


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if _is_float(a) else np.zeros(a.shape, bool)


def _display(path: Path) -> str:
    """Relative to the working directory when inside it (short, and what the user typed from)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def reproduce_command(path: str, target: str, config: str | None = None) -> str:
    with_config = f" --config {shlex.quote(config)}" if config else ""
    return f"python -m conformance.reproduce {path} --target {shlex.quote(target)}{with_config}"


def folder_name(target: str) -> str:
    """``target`` as part of a folder name (an ``external:COMMAND`` id holds spaces and slashes)."""
    return re.sub(r"[^A-Za-z0-9_.@+-]+", "_", target)[:60]


def refusal_text(error) -> str:
    """How a failure folder records an error a program must be refused with: class and message."""
    return f"{type(error).__name__}: {error.message}"


class NotAFailure(Exception):
    """A folder ``read_failure`` cannot use: the message says which file and why."""


@dataclass
class Failure:
    """A conformance failure folder, loaded."""

    folder: Path
    meta: dict
    source: str
    inputs: dict[str, np.ndarray]
    want: dict[str, np.ndarray]
    tol: Tolerance


def read_failure(folder: Path) -> Failure:
    """A failure folder as ``write_failure`` wrote it, or ``NotAFailure`` naming what is missing."""
    if not folder.is_dir():
        raise NotAFailure(f"{folder} is not a conformance failure folder: not a directory")
    name = "case.json"
    try:
        meta = json.loads((folder / name).read_text())
        name = "case.tile"
        source = (folder / name).read_text()
        name = "inputs.npz"
        inputs = _load_npz(folder / name)
        name = "expected.npz"
        want = _load_npz(folder / name)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise NotAFailure(f"{folder} is not a conformance failure folder: {name}: {why}") from None
    try:
        tol = Tolerance(**meta["tolerance"])
        if not all(isinstance(meta[k], str) for k in ("target", "family", "problem")):
            raise TypeError("target, family and problem are strings")
    except (TypeError, KeyError) as e:
        what = f"{type(e).__name__}: {e}"
        raise NotAFailure(f"{folder}/case.json lacks what the suite writes ({what})") from None
    return Failure(folder, meta, source, inputs, want, tol)


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: from_npz(z[k]) for k in z.files}  # bfloat16 comes back from |V2


def write_failure(
    case,
    target: str,
    want: dict,
    got: dict | None,
    problem: str,
    tol: Tolerance,
    refusal: str | None = None,
    config: str | None = None,
) -> str:
    """Write one failing example; returns its directory as shown to the user. ``refusal``: the
    interpreter's error (``Class: message``) where it refuses the program and the target did not;
    ``config``: the user's config file the target ran with (``--config``)."""
    digest = example_digest(case.source, case.inputs)
    folder = FAILURES / f"{case.family}-{folder_name(target)}-{digest[:10]}"
    folder.mkdir(parents=True, exist_ok=True)
    shown = _display(folder)
    header = [
        f"// conformance failure: family {case.family}, target {target}",
        *(f"// {line}" for line in problem.splitlines()),
        f"// reproduce: {reproduce_command(shown, target, config)}",
        _run_it(shown, target, config),
    ]
    (folder / "case.tile").write_text("\n".join(header) + "\n" + case.source.rstrip() + "\n")
    np.savez(folder / "inputs.npz", **case.inputs)
    np.savez(folder / "expected.npz", **want)
    if got is not None:
        np.savez(folder / "got.npz", **got)
    elif (folder / "got.npz").exists():
        (folder / "got.npz").unlink()
    meta = {"family": case.family, "target": target, "problem": problem, "tolerance": asdict(tol)}
    if refusal is not None:
        meta["refusal"] = refusal
    if config is not None:
        meta["config"] = str(Path(config).resolve())
    (folder / "case.json").write_text(json.dumps(meta, indent=2) + "\n")
    STATS.written.append((shown, target, str(folder)))
    STATS.problems[shown] = (problem, reproduce_command(shown, target, config))
    if STATS.current is not None:
        STATS.failing.add(STATS.current)
    return shown


def _run_it(shown: str, target: str, config: str | None = None) -> str:
    """The header line saying how to look at the failing program by hand."""
    if target.startswith("stripe:"):  # a pass of a config, checked by the Stripe interpreter
        name, _, step = target.removeprefix("stripe:").partition("@")
        which = f"--config {shlex.quote(config)}" if config else f"--target {name.removesuffix('-small')}"
        return (
            f"// or see it: python -m tile emit {shown}/case.tile --stage optimized {which} "
            f"--after {step} --inputs {shown}/inputs.npz   (the -small variant shrinks every memory)"
        )
    with_config = f" --config {shlex.quote(config)}" if config else ""
    return (
        f"// or run it: python -m tile run {shown}/case.tile --target {shlex.quote(target)}{with_config} "
        f"--inputs {shown}/inputs.npz --output got.npz   (compare with expected.npz)"
    )


def short_failure(error: BaseException) -> str | None:
    """A failing conformance test as the suite reports it by default (``--tb`` not given): for each
    failing example it wrote, what differs on one line and the command that reruns it. None where
    ``error`` is not only such failures (an error in the suite itself keeps its traceback)."""
    stack, lines = [error], []
    while stack:
        e = stack.pop(0)
        if getattr(e, "exceptions", None):  # Hypothesis found several distinct failures
            stack.extend(e.exceptions)
            continue
        if not isinstance(e, AssertionError):
            return None
        text = str(e)
        named = [shown for shown in STATS.problems if shown in text]
        if not named:
            return None
        for shown in named:
            problem, command = STATS.problems[shown]
            lines += ["; ".join(problem.splitlines()), f"    reproduce: {command}"]
    lines.append("(the example's program is in its folder; --tb=short shows Hypothesis's whole report)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- summary


@dataclass
class Row:
    tests: int = 0
    examples: int = 0
    invalid: int = 0  # the interpreter rejects the drawn program for its inputs
    unsupported: int = 0  # the target lacks a dtype the program uses
    declared: int = 0  # outside what the target declares (tile.capabilities.Declared): not run
    unfocused: int = 0  # using none of the --conformance-ops operations: not run
    expected: int = 0  # differences the target declares (a documented semantic difference)
    other_shard: int = 0  # drawn, but checked by another shard (--conformance-shard)
    failed: int = 0
    stopped: int = 0  # tests that failed on an example (not on an error of the suite, say)
    after_failure: int = 0  # of the counted examples, those drawn after the test's first failing one
    seconds: float = 0.0
    # the XOR of the hashes (``targets.example_digest``) of this shard's examples, compared, invalid
    # or unsupported: independent of order, so the shards of a run XOR to the unsharded run's
    fingerprint: int = 0


@dataclass
class Stats:
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    unsupported: Counter = field(default_factory=Counter)  # (target, reason) -> examples
    expected_reasons: Counter = field(default_factory=Counter)  # (target, reason) -> examples
    test_expected: list[str] = field(default_factory=list)  # reasons met by the running test
    failures: list[tuple[str, str]] = field(default_factory=list)  # (directory, target)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (family, target, reason)
    current: tuple[str, str] | None = None  # (family, target) of the running conformance test
    written: list[tuple[str, str, str]] = field(default_factory=list)  # (shown, target, path) this test
    seen: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # digests counted per row
    problems: dict[str, tuple[str, str]] = field(default_factory=dict)  # shown -> (problem, command)
    failing: set[tuple[str, str]] = field(default_factory=set)  # rows whose running test has failed
    tables: dict[str, list[dict]] = field(default_factory=dict)  # a family's own table (math_accuracy)
    declared_reasons: Counter = field(default_factory=Counter)  # (target, reason) -> examples
    narrowed: Counter = field(default_factory=Counter)  # (target, what was left out) -> sweeps run without it
    coverage: Coverage = field(default_factory=Coverage)  # what the compared examples exercised
    onnx: list = field(default_factory=list)  # conformance.onnx_nodes.Record per ONNX node case run

    def row(self, key: tuple[str, str]) -> Row:
        return self.rows.setdefault(key, Row())

    def drawn(self, key: tuple[str, str], digest: str | None) -> Row | None:
        """The row to count an example of this ``targets.example_digest`` in, once: None for a
        replay of one already counted (Hypothesis replays a failing example while it shrinks, and
        once more to report it) and for another shard's example (counted as such here). The
        fingerprint is the XOR of the digests this shard counts, so the shards' XOR together is
        the unsharded run's. Without a digest (a direct call) the example is counted as new."""
        row = self.row(key)
        if digest is None:
            return row
        seen = self.seen.setdefault(key, set())
        if digest in seen:
            return None
        seen.add(digest)
        if not targets.SHARD.takes(digest):
            row.other_shard += 1
            return None
        row.fingerprint ^= int(digest[:16], 16)
        row.after_failure += key in self.failing
        return row

    def example(self, key: tuple[str, str], digest: str | None = None) -> bool:
        """An example compared with the interpreter; whether it is counted (not a replay)."""
        row = self.drawn(key, digest)
        if row is not None:
            row.examples += 1
        return row is not None

    def declared_unsupported(self, key: tuple[str, str], reason: str, digest: str | None = None) -> None:
        """An example outside the target's declaration: not run, and no failure."""
        row = self.drawn(key, digest)
        if row is not None:
            row.declared += 1
            self.declared_reasons[(key[1], reason)] += 1

    def unfocused(self, key: tuple[str, str], digest: str | None = None) -> None:
        """An example using none of the ``--conformance-ops`` operations: not run."""
        row = self.drawn(key, digest)
        if row is not None:
            row.unfocused += 1

    def invalid(self, key: tuple[str, str], digest: str | None = None) -> None:
        """An example the interpreter refuses (the target must refuse it alike)."""
        row = self.drawn(key, digest)
        if row is not None:
            row.invalid += 1

    def expected(self, key: tuple[str, str], reason: str) -> None:
        """An example on which the target differs for a reason it declares (not a failure)."""
        self.row(key).expected += 1
        self.expected_reasons[(key[1], reason)] += 1
        self.test_expected.append(reason)

    def other_shard(self, key: tuple[str, str], digest: str | None = None) -> None:
        """An example another shard checks (``drawn`` counts it so given its digest)."""
        if digest is None:
            self.row(key).other_shard += 1
        else:
            self.drawn(key, digest)

    def unsupported_example(self, key: tuple[str, str], reason: str, digest: str | None = None) -> None:
        """An example using a dtype the target lacks: not run."""
        row = self.drawn(key, digest)
        if row is not None:
            row.unsupported += 1
            self.unsupported[(key[1], reason)] += 1

    def finish_test(self, key: tuple[str, str], failed: bool, seconds: float, message: str) -> None:
        """Record a finished test; remove the failure directories its final report does not name."""
        row = self.row(key)
        row.tests += 1
        row.failed += failed
        row.seconds += seconds
        named = [w for w in self.written if failed and w[0] in message]
        for _, _, path in set(self.written) - set(named):
            shutil.rmtree(path, ignore_errors=True)
        self.failures.extend((shown, target) for shown, target, _ in dict.fromkeys(named))
        self.written.clear()
        self.problems.clear()
        row.stopped += failed and key in self.failing
        self.failing.discard(key)

    def compared_nothing(self) -> str | None:
        """Why a run of the conformance families validated nothing, or None. A run that compared
        no example on any target (every test skipped, every example unsupported) must not pass;
        one whose examples all fell to other shards did draw them, and one that ran no family
        (unit tests only), or found no device at all where none was asked for, is not such a run."""
        rows = self.rows.values()
        if not self.rows and not self.skipped:
            return None
        if any(r.examples or r.other_shard for r in rows):
            return None
        if not self.rows and all(t == targets.NO_DEVICE for _, t, _ in self.skipped):
            return None
        why = [f"{f} on {t}: skipped, {r}" for f, t, r in sorted(set(self.skipped))]
        why += [f"{t}: {n} example(s) not run, {r}" for (t, r), n in sorted(self.unsupported.items())]
        why += [f"{t}: {n} example(s) not run, declared unsupported: {r}"
                for (t, r), n in sorted(self.declared_reasons.items())]
        why += [f"{f} on {t}: {r.unfocused} example(s) used none of the --conformance-ops operations"
                for (f, t), r in sorted(self.rows.items()) if r.unfocused]
        why += [f"{f} on {t}: all {r.invalid} example(s) refused by the interpreter"
                for (f, t), r in sorted(self.rows.items()) if r.invalid]
        if len(why) > 12:
            why[11:] = [f"... ({len(why) - 11} more)"]
        shown = "".join(f"\n  {w}" for w in why)
        return (
            "conformance: compared no example on any target, so this run validated nothing; it fails "
            f"(check --target, --config and -k):{shown}"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "rows": [[*k, asdict(v)] for k, v in self.rows.items()],
                "unsupported": [[*k, n] for k, n in self.unsupported.items()],
                "expected": [[*k, n] for k, n in self.expected_reasons.items()],
                "failures": self.failures,
                "skipped": self.skipped,
                "tables": self.tables,
                "declared": [[*k, n] for k, n in self.declared_reasons.items()],
                "narrowed": [[*k, n] for k, n in self.narrowed.items()],
                "coverage": self.coverage.to_json(),
                "onnx": [asdict(r) for r in self.onnx],
            }
        )

    def merge(self, text: str) -> None:
        data = json.loads(text)
        for family, target, r in data["rows"]:
            row = self.row((family, target))
            for k, v in r.items():
                setattr(row, k, getattr(row, k) ^ v if k == "fingerprint" else getattr(row, k) + v)
        for target, reason, n in data["unsupported"]:
            self.unsupported[(target, reason)] += n
        for target, reason, n in data["expected"]:
            self.expected_reasons[(target, reason)] += n
        self.failures.extend(tuple(f) for f in data["failures"])
        self.skipped.extend(tuple(s) for s in data["skipped"])
        for name, rows in data.get("tables", {}).items():
            self.tables.setdefault(name, []).extend(rows)
        for target, reason, n in data.get("declared", []):
            self.declared_reasons[(target, reason)] += n
        for target, what, n in data.get("narrowed", []):
            self.narrowed[(target, what)] += n
        self.coverage.merge(data.get("coverage", {}))
        self.onnx.extend(onnx_nodes.Record(**r) for r in data.get("onnx", []))

    def lines(self, profile: str) -> list[str]:
        if not self.rows and not self.skipped:
            return onnx_nodes.lines(self.onnx)
        sharded = any(r.other_shard for r in self.rows.values())
        declaring = any(r.declared for r in self.rows.values())
        focused = any(r.unfocused for r in self.rows.values())
        head = ("family", "target", "tests", "examples", "invalid", "unsupported")
        head += ("declared unsupported",) if declaring else ()
        head += ("failed", "expected", "seconds")
        head += ("other shards",) if sharded else ()
        head += ("not in --conformance-ops",) if focused else ()
        table = [head]
        for (family, target), r in sorted(self.rows.items()):
            cells = (r.tests, r.examples, r.invalid, r.unsupported)
            cells += (r.declared,) if declaring else ()
            cells += (r.failed, r.expected, f"{r.seconds:.1f}")
            cells += (r.other_shard,) if sharded else ()
            cells += (r.unfocused,) if focused else ()
            table.append((family, target, *map(str, cells)))
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        out = [
            "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in table
        ]
        for family, target, reason in sorted(set(self.skipped)):
            out.append(f"skipped {family} on {target}: {reason}")
        for (target, reason), n in sorted(self.unsupported.items()):
            out.append(f"not run on {target}: {n} example(s), {reason}")
        for (target, reason), n in sorted(self.declared_reasons.items()):
            out.append(f"declared unsupported on {target}: {n} example(s), {reason}")
        for (target, what), n in sorted(self.narrowed.items()):
            out.append(f"narrowed on {target}: {n} sweep(s) run without their outputs using {what}")
        for (target, reason), n in sorted(self.expected_reasons.items()):
            out.append(f"expected difference on {target}: {n} example(s), {reason}")
        for folder, target in self.failures:
            out.append(f"failing example: {folder}  ->  {reproduce_command(folder, target)}")
        for (family, target), r in sorted(self.rows.items()):
            if r.stopped:
                out.append(
                    f"{family} on {target} stopped at its first failing example: Hypothesis drew "
                    f"{r.after_failure} of its {r.examples + r.invalid + r.unsupported} examples after it, "
                    "looking for other failures and shrinking; fix it and rerun to check the rest"
                )
        for name, table in sorted(self.tables.items()):
            out += table_lines(name, table)
        out += self.coverage.lines()
        out += onnx_nodes.lines(self.onnx)
        rows = self.rows.values()
        examples, failed = sum(r.examples for r in rows), sum(r.failed for r in rows)
        seconds = sum(r.seconds for r in rows)
        out.append(
            f"total: {examples} examples compared, {failed} failing test(s), {seconds:.1f} s "
            f"(profile {profile}; 'invalid' examples are programs the interpreter refuses, which each target"
            " must refuse with the same error)"
        )
        return out


    def summary(self, profile: str, shard: str, seconds: float) -> dict:
        """The run as data (``--conformance-json``): rows per family and target, the examples not
        run and why, the expected differences, the failure folders and the totals."""
        rows = [
            {"family": f, "target": t, **asdict(r), "fingerprint": f"{r.fingerprint:016x}"}
            for (f, t), r in sorted(self.rows.items())
        ]
        return {
            "profile": profile,
            "shard": shard,
            "rows": rows,
            "skipped": [{"family": f, "target": t, "reason": r} for f, t, r in sorted(set(self.skipped))],
            "unsupported": _counted(self.unsupported),
            "tables": self.tables,
            "declared_unsupported": _counted(self.declared_reasons),
            "narrowed": _counted(self.narrowed),
            "coverage": self.coverage.summary(),
            "expected": _counted(self.expected_reasons),
            "onnx": onnx_nodes.summary(self.onnx),
            "failures": [
                {"folder": f, "target": t, "reproduce": reproduce_command(f, t)}
                for f, t in self.failures
            ],
            "total": {
                "examples": sum(r["examples"] for r in rows),
                "failed_tests": sum(r["failed"] for r in rows),
                "test_seconds": sum(r["seconds"] for r in rows),
                "wall_seconds": seconds,
            },
        }


def table_lines(name: str, rows: list[dict]) -> list[str]:
    """A family's table (``Stats.tables[name]``, rows of like dicts) as aligned text lines."""
    if not rows:
        return []
    head = list(rows[0])
    cells = [head] + [[str(r.get(k, "")) for k in head] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return [f"{name}:"] + ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]


def _counted(counter: Counter) -> list[dict]:
    return [{"target": t, "reason": r, "examples": n} for (t, r), n in counter.items()]


STATS = Stats()


if __name__ == "__main__":  # python -m conformance.report --target ID: the capability and result sheet
    import sys

    from conformance.capabilities import main

    sys.exit(main())
