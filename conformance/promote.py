"""``python -m conformance.promote``: keep a failure in the regression corpus (``conformance.corpus``).

    python -m conformance.promote conformance/failures/DIR [DIR ...] [--name NAME] [--note TEXT]
    python -m conformance.promote --mutant NAME|all       a seeded defect's witness (conformance.mutants)
    python -m conformance.promote --program F.tile --inputs F.npz --name NAME --note TEXT
    python -m conformance.promote --refresh [NAME ...]    recompute expected.npz after an intended
                                                          change of the interpreter
    python -m conformance.promote --list

Each entry keeps the program, its inputs and the interpreter's outputs computed now (never the
failing target's); the default conformance run replays every entry on every target
(``test_regressions.py``). An entry over ``--max-kib`` (default 64) is refused. Exit status 0: kept
(or already kept); 2: nothing usable to keep, the reason printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance import corpus, report
from conformance.corpus import PromoteError, program_text
from conformance.report import Tolerance


def from_failure(folder: Path, name: str | None, note: str, **kw) -> Path:
    """A failure folder the suite wrote, kept as an entry (named ``<family>-<hash>`` by default)."""
    try:
        failure = report.read_failure(folder)
    except report.NotAFailure as e:
        raise PromoteError(str(e)) from None
    meta, body = failure.meta, program_text(failure.source)
    family, tol = meta["family"], failure.tol
    rule = None
    if family == "products":  # check() derives its tolerance from the dtype and the length
        dtype = corpus._float_dtype(failure.inputs)
        length = corpus.product_length(failure)
        rule = {"exact": False, "ulps": 0.0, "length": length, "notes": {"dtype": str(dtype)}}
    if meta.get("config"):
        print(
            f"note: {folder.name} was found with the config {meta['config']}; the entry replays with each "
            "target's own config (a user's config is not kept)",
            file=sys.stderr,
        )
    want, _ = corpus.interpreter_answer(body, failure.inputs)
    if meta.get("refusal") is None and report.compare(failure.want, want, Tolerance()) is not None:
        print(
            "note: the interpreter's answer differs from the folder's expected.npz (it changed since): "
            "the entry keeps today's",
            file=sys.stderr,
        )
    digest = report.example_digest(body, failure.inputs)
    return corpus.write(
        name or f"{family}-{digest[:10]}",
        body,
        failure.inputs,
        family=family,
        target=meta["target"],
        problem=meta["problem"],
        tolerance=tol,
        origin=f"conformance/failures/{folder.name}",
        note=note,
        passes=family == "optimized",
        rule=rule,
        **kw,
    )


def from_mutant(mutant_name: str, name: str | None, note: str, **kw) -> Path:
    """A seeded defect's witness (compared exactly, as ``test_mutants`` does)."""
    from conformance.mutants import MUTANTS

    m = MUTANTS.get(mutant_name)
    if m is None:
        raise PromoteError(f"no seeded defect '{mutant_name}' (`python -m conformance.mutants --list`)")
    return corpus.write(
        name or f"mutant-{m.name}",
        m.witness.source,
        m.witness.inputs,
        family="witness",
        target=m.device_id,
        problem=f"seeded defect ({m.level}, {m.kind}): {m.what}",
        tolerance=Tolerance(),
        origin=f"conformance.mutants witness of {m.name}",
        note=note,
        passes=bool(m.witness.settings.get("config")),
        **kw,
    )


def from_program(
    path: Path, inputs_path: Path, name: str, note: str, target: str, ulps: float = 0.0, length: int = 1, **kw
) -> Path:
    """A hand-written program (a bug found outside the suite), compared exactly, or (``ulps``) within
    ``ulps`` epsilons of its coarsest float type times its reduction length (``--length``)."""
    from tile.inputs import load_npz

    try:
        source = path.read_text()
        inputs = load_npz(str(inputs_path))
    except (OSError, ValueError) as e:
        raise PromoteError(f"cannot read the program or its inputs: {e}") from None
    return corpus.write(
        name,
        source,
        inputs,
        family="hand-written",
        target=target,
        problem=note.splitlines()[0] if note else "a bug found by hand",
        tolerance=Tolerance(exact=not ulps, ulps=ulps, length=length),
        origin=f"hand-written ({path.name})",
        note=note,
        **kw,
    )


def refresh(names: list[str], where: Path) -> int:
    """Recompute the interpreter's answers of these entries (all: none named); print each change."""
    changed = 0
    for e in corpus.entries(where):
        if names and e.name not in names:
            continue
        why = corpus.oracle_change(e)
        if why is None:
            continue
        m = e.meta
        corpus.write(
            e.name, e.source, e.inputs, family=m["family"], target=m["target"], problem=m["problem"],
            tolerance=e.failure.tol, origin=m.get("origin", ""), note=m.get("note", ""),
            passes=e.passes, rule=m.get("rule"), corpus=where, replace=True,
        )  # fmt: skip
        print(f"{e.name}: expected.npz recomputed ({why})")
        changed += 1
    print(f"{changed} entr{'y' if changed == 1 else 'ies'} changed")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.promote", description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, help="failure folders (conformance/failures/...)")
    p.add_argument("--name", help="the entry's name (one source only; default: <family>-<hash>)")
    p.add_argument("--note", default="", help="what the entry shows (the bug, the commit that fixed it)")
    p.add_argument(
        "--mutant", action="append", default=[], metavar="NAME", help="a witness ('all': every one)"
    )
    p.add_argument("--program", type=Path, metavar="F.tile", help="a hand-written program (needs --inputs)")
    p.add_argument("--inputs", type=Path, metavar="F.npz", help="the inputs of --program")
    p.add_argument("--target", default="llvm_cpu.0", help="where --program failed (history only)")
    p.add_argument("--ulps", type=float, default=0.0, help="--program: within U epsilons")
    p.add_argument("--length", type=int, default=1, help="--program: the reduction length --ulps scales by")
    p.add_argument("--refresh", nargs="*", metavar="NAME", help="recompute entries' expected outputs")
    p.add_argument("--list", action="store_true", help="list the corpus")
    p.add_argument("--max-kib", type=float, default=corpus.LIMIT_BYTES / 1024, help="size limit per entry")
    p.add_argument("--corpus", type=Path, default=corpus.CORPUS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    kw = {"corpus": args.corpus, "limit": int(args.max_kib * 1024)}
    try:
        if args.list:
            for e in corpus.entries(args.corpus):
                first = e.meta["problem"].splitlines()[0]
                print(f"{e.name}: {e.meta['family']} on {e.meta['target']}: {first}")
            return 0
        if args.refresh is not None:
            return refresh(args.refresh, args.corpus)
        mutants = args.mutant
        if mutants == ["all"]:
            from conformance.mutants import MUTANTS

            mutants = sorted(MUTANTS)
        sources = len(args.dirs) + len(mutants) + (args.program is not None)
        if sources == 0:
            p.error(
                "give failure folders, --mutant NAME, --program F.tile --inputs F.npz, --refresh or --list"
            )
        if args.name and sources > 1:
            p.error("--name names one entry: give one source with it")
        if args.program is not None and (args.inputs is None or not args.name):
            p.error("--program needs --inputs F.npz and --name NAME")
    except PromoteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = [lambda d=d: from_failure(d, args.name, args.note, **kw) for d in args.dirs]
    jobs += [lambda m=m: from_mutant(m, args.name, args.note, **kw) for m in mutants]
    if args.program is not None:
        jobs.append(
            lambda: from_program(
                args.program, args.inputs, args.name, args.note, args.target, args.ulps, args.length, **kw
            )
        )
    status = 0
    for job in jobs:  # each source on its own: one unusable folder does not stop the others
        try:
            folder = job()
        except corpus.AlreadyKept as e:
            print(f"already kept: {e}")
            continue
        except PromoteError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
            continue
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"kept {report._display(folder)} ({size / 1024:.1f} KiB)")
    return status


if __name__ == "__main__":
    sys.exit(main())
