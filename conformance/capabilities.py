"""What the suite does with a target's declaration (``tile.capabilities.Declared``), and the
capability and result sheet of ``python -m conformance.report --target ID``.

A subject's declaration is its device's (``Capabilities.declared``: a plugin sets it, an
external backend's version 2 handshake sends it) narrowed by the ``"capabilities"`` of the
user's config (``--config``). ``outside`` says why an example falls outside it (an operation,
a dtype, a rank or size it does not declare): the example is not run and is counted as "declared
unsupported", apart from failures. Inside the declaration nothing changes: a target that refuses
an example it declared, or refuses one while declaring nothing, fails, and ``refusal`` words that.
The tolerance class scales the comparison (``tolerance``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from conformance.coverage import dtypes_used, sites
from tile.capabilities import RELAXED, Declared
from tile.errors import TileDeviceError

ROOT = Path(__file__).resolve().parent.parent


def outside(declared: Declared | None, program, bound) -> str | None:
    """Why the example (``program`` as parsed, ``bound`` for its inputs) is outside ``declared``,
    or None: a short reason the summary counts examples by."""
    if declared is None:
        return None
    for dt in sorted(dtypes_used(bound), key=str):
        if not declared.allows_dtype(dt):
            return f"dtype {dt}"
    for s in sites(program, bound.constants):
        if not declared.allows_operation(s.op):
            return f"operation {s.op}"
    shapes = [t.shape for t in bound.types.values() if t.shape is not None]
    if declared.max_rank is not None and any(len(s) > declared.max_rank for s in shapes):
        return f"rank over max_rank {declared.max_rank}"
    if declared.max_elements is not None and any(math.prod(s) > declared.max_elements for s in shapes):
        return f"a tensor over max_elements {declared.max_elements}"
    return None


def tolerance(declared: Declared | None, tol):
    """``tol`` (a ``report.Tolerance``) as the declared tolerance class has it."""
    if declared is None or declared.tolerance == "standard":
        return tol
    if declared.tolerance == "exact":
        return replace(tol, exact=True)
    return replace(tol, ulps=tol.ulps * RELAXED)


def is_refusal(error: BaseException) -> bool:
    """Whether a target's exception says it cannot run the program (not that it broke)."""
    text = str(error).lower()
    return isinstance(error, (NotImplementedError, TileDeviceError)) or "unsupported" in text or (
        "not supported" in text
    )


def refusal(device_id: str, declared: Declared | None) -> str:
    """What to add to a failure where the target refused an example inside its declaration."""
    what = "declares nothing" if declared is None else f"declares {json.dumps(declared.to_json())}"
    return (
        f"an undeclared refusal: {device_id} {what}, and this example is within it; declare what it "
        "cannot run (Capabilities.declared, the handshake's \"capabilities\", a config's "
        "\"capabilities\": docs/new_target.md) or implement it"
    )


def problem(declared: Declared | None) -> str | None:
    """What is wrong with a device's declaration (a plugin's mistake), or None."""
    if declared is None:
        return None
    if not isinstance(declared, Declared):
        return f"Capabilities.declared is a {type(declared).__name__}, not a tile.capabilities.Declared"
    bad = declared.invalid()
    return None if bad is None else f"Capabilities.declared.{bad[0]}: {bad[1]} ({bad[2]})"


# ------------------------------------------------------------------------------ the sheet
def declaration_lines(target: str, config: str | None = None) -> list[str]:
    """What ``target`` (and ``config``) declare, as the sheet prints it."""
    from backends import registry
    from stripe.config import resolve_config

    dev = registry.get(target)
    caps = dev.capabilities
    declared = getattr(caps, "declared", None)
    if config:
        declared = (declared or Declared()).restrict(resolve_config(config).capabilities)
    dtypes = ", ".join(sorted(d.value for d in caps.dtypes))
    out = [f"device: {target}: {dev.description}", f"dtypes (the device's): {dtypes}; fp64 {caps.fp64}"]
    if declared is None:
        return out + ["declared: nothing beyond the dtypes (every operation is claimed)"]
    d = declared.to_json()
    for key in ("operations", "dtypes", "stages"):
        out.append(f"declared {key}: " + (", ".join(d[key]) if key in d else "all"))
    limits = [f"{k} {d[k]}" for k in ("max_rank", "max_elements") if k in d]
    out.append("declared limits: " + (", ".join(limits) or "none"))
    out.append(f"declared tolerance class: {declared.tolerance}")
    return out


def result_lines(summary: dict) -> list[str]:
    rows = summary["rows"]
    head = ("family", "compared", "declared unsupported", "unsupported", "invalid", "result")
    table = [head]
    for r in rows:
        verdict = "FAILED" if r["failed"] else "passed"
        counts = (str(r.get(k, 0)) for k in ("examples", "declared", "unsupported", "invalid"))
        table.append((r["family"], *counts, verdict))
    for s in summary.get("skipped", []):
        table.append((s["family"], "-", "-", "-", "-", f"skipped: {s['reason']}"))
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    out = ["  " + "  ".join(c.ljust(w) for c, w in zip(t, widths)) for t in table]
    failed = [r["family"] for r in rows if r["failed"]]
    total = summary["total"]["examples"]
    verdict = "FAILED in " + ", ".join(failed) if failed else "PASSED"
    out.append(f"result: {verdict}, {total} examples compared "
               f"(profile {summary['profile']}, shard {summary['shard']})")
    for d in summary.get("declared_unsupported", []):
        out.append(f"declared unsupported: {d['examples']} example(s), {d['reason']}")
    for f in summary.get("failures", []):
        out.append(f"failing example: {f['folder']}  ->  {f['reproduce']}")
    return out


def coverage_lines(summary: dict, target: str) -> list[str]:
    cov = summary.get("coverage", {}).get(target)
    if not cov:
        return ["no example was compared: nothing is covered"]
    n = len(cov["distinguished"]) + len(cov["reached"]) + len(cov["unexercised"])
    out = [f"{len(cov['distinguished'])}/{n} operations distinguished",
           f"only reached ({len(cov['reached'])}): {', '.join(cov['reached']) or 'none'}",
           f"unexercised ({len(cov['unexercised'])}): {', '.join(cov['unexercised']) or 'none'}"]
    for cat in ("dtype", "index"):
        met = [f"{r['name']} {r['examples']}" for r in cov["table"] if r["category"] == cat]
        out.append(f"examples per {'dtype' if cat == 'dtype' else 'index form'}: {', '.join(met) or 'none'}")
    return out


def mutation_lines(data: dict | None, target: str) -> list[str]:
    if data is None:
        return ["not measured: give --mutants F (written by python -m conformance.mutants --json F), "
                "or --mutants-fast to run the CI subset now"]
    from conformance.mutants import MUTANTS

    results = data["results"]
    mine = [r for r in results if r["name"] in MUTANTS and MUTANTS[r["name"]].base_id == target]
    shown = mine or results
    killed = sum(r["status"] == "killed" for r in shown)
    bases = sorted({MUTANTS[r["name"]].base_id for r in results if r["name"] in MUTANTS})
    where = (f"the {len(mine)} seeded defects of {target}" if mine else
             f"the seeded defects of the reference devices ({', '.join(bases)}): "
             f"{target} has none of its own")
    out = [f"killed {killed}/{len(shown)} ({100.0 * killed / max(len(shown), 1):.0f}%) of {where}"]
    out += [f"  {r['name']}: {r['status']}" + (f" by {r['family']}" if r.get("family") else "")
            for r in shown]
    return out


def sheet(target: str, summary: dict, mutants: dict | None, config: str | None = None) -> str:
    parts = [f"# Conformance sheet: {target}", "", "## Declared", *declaration_lines(target, config),
             "", "## Run", *result_lines(summary),
             "", "## Coverage", *coverage_lines(summary, _name(target, config)),
             "", "## Mutation score", *mutation_lines(mutants, target)]
    return "\n".join(parts) + "\n"


def _name(target: str, config: str | None) -> str:
    if not config:
        return target
    from stripe.config import resolve_config

    return f"{target}+{resolve_config(config).name}"


def run_suite(target: str, examples: int, config: str | None, extra: list[str], out: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", "conformance/test_conformance.py", "-q", "-p", "no:cacheprovider",
           f"--target={target}", f"--conformance-examples={examples}", f"--conformance-json={out}",
           f"--conformance-failures={out.parent / 'failures'}", *(["--config", config] if config else []),
           *extra]
    return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), stdout=sys.stderr).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m conformance.report",
        description="A capability and result sheet for a target: what it declares, what the suite ran, "
        "passed and covered, and the mutation score of the seeded defects.",
    )
    ap.add_argument("--target", required=True, metavar="ID", help="a device id (python -m tile devices)")
    ap.add_argument("--config", metavar="F.json", help="validate the target compiled with this config")
    ap.add_argument("--examples", type=int, default=20, metavar="N", help="examples per family (default 20)")
    ap.add_argument("--summary", metavar="F", help="use this --conformance-json summary instead of running")
    ap.add_argument("--mutants", metavar="F", help="a python -m conformance.mutants --json report")
    ap.add_argument("--mutants-fast", action="store_true", help="run the CI subset of the mutants now (slow)")
    ap.add_argument("--output", metavar="F", help="write the sheet here too")
    args, extra = ap.parse_known_args(argv)
    from backends import registry

    try:
        registry.get(args.target)
    except TileDeviceError as e:
        ap.error(f"--target {args.target}: {e.message}")
    with tempfile.TemporaryDirectory(prefix="tile-sheet-") as tmp:
        if args.summary:
            summary = json.loads(Path(args.summary).read_text())
        else:
            path = Path(tmp) / "summary.json"
            run_suite(args.target, args.examples, args.config, extra, path)
            if not path.exists():
                print(f"the conformance run of {args.target} wrote no summary (see above)", file=sys.stderr)
                return 2
            summary = json.loads(path.read_text())
    mutants = json.loads(Path(args.mutants).read_text()) if args.mutants else None
    if args.mutants_fast:
        from dataclasses import asdict

        from conformance.mutants.run import FAST, run_all, score

        results = run_all(list(FAST))
        mutants = {"score": score(results), "results": [asdict(r) for r in results]}
    text = sheet(args.target, summary, mutants, args.config)
    print(text, end="")
    if args.output:
        Path(args.output).write_text(text)
    return 1 if any(r["failed"] for r in summary["rows"]) else 0
