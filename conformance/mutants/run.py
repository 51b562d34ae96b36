"""``python -m conformance.mutants``: the default conformance run against each seeded defect.

Each mutant gets its own ``pytest conformance/test_conformance.py --target mutant:NAME -x`` (the
ci profile, the families in the order the default run has them; ``-x``: the first failing family
ends it), in a child process, so one that crashes takes only itself down. It is *killed* when a
family fails, and reported with the family and the seconds from the start of its run; *survived*
when every family passed (``never applied``: its rewrite found nothing to change in any program
the suite compiled). ``--json F`` writes the same report as data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from conformance.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
# the subset CI runs (conformance/test_mutation_score.py): one of each level, varied kinds
FAST = (
    "stripe_max_as_min",
    "stripe_agg_max_as_min",
    "stripe_lt_as_le",
    "llvm_sdiv_as_udiv",
    "llvm_loop_bound_short",
    "opencl_workitem_edge",
)
_FAILED = re.compile(r"^FAILED \S*::test_(\w+)\[", re.M)


@dataclass
class Result:
    name: str
    level: str
    kind: str
    status: str  # killed, survived, timeout
    family: str | None  # the family that killed it
    seconds: float
    applied: bool | None  # whether the rewrite changed any compiled program (None: not known)
    detail: str = ""  # the failing assertion's first line, or why the run ended


def command(name: str, workdir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "conformance/test_conformance.py", f"--target=mutant:{name}",
        "-x", "-q", "-rf", "-p", "no:cacheprovider", "-p", "no:randomly",
        f"--conformance-failures={workdir / 'failures'}", *extra,
    ]  # fmt: skip


def run_one(name: str, timeout: float = 900.0, extra: tuple[str, ...] = ()) -> Result:
    """One mutant's conformance run, in a child process."""
    m = MUTANTS[name]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        workdir = Path(tmp)
        log = workdir / "applied.log"
        env = {**os.environ, "TILE_MUTANT_LOG": str(log)}
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command(name, workdir, extra), cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=timeout,
            )  # fmt: skip
            out, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            out, code = str(e.stdout or ""), None
        seconds = time.perf_counter() - start
        lines = log.read_text().split() if log.exists() else []
        applied = "applied" in lines if lines else None
    failed = _FAILED.search(out)
    if code is None:
        status, family, detail = "timeout", None, f"no verdict within {timeout:.0f} s"
    elif failed:
        status, family = "killed", failed.group(1)
        detail = next((ln[2:].strip() for ln in out.splitlines() if ln.startswith("E ")), "")
    elif code == 0:
        status, family, detail = "survived", None, ""
    else:  # pytest itself failed (a crash of the child, a usage error): the defect broke the run
        status, family = "killed", "crash"
        detail = f"pytest exited {code}: " + (out.strip().splitlines() or [""])[-1]
    return Result(name, m.level, m.kind, status, family, round(seconds, 1), applied, detail[:200])


def run_all(names: list[str], jobs: int = 1, timeout: float = 900.0, progress=None) -> list[Result]:
    results: dict[str, Result] = {}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for r in pool.map(lambda n: run_one(n, timeout), names):
            results[r.name] = r
            if progress is not None:
                progress(r)
    return [results[n] for n in names]


def score(results: list[Result]) -> str:
    killed = [r for r in results if r.status == "killed"]
    n = len(results)
    median = statistics.median(r.seconds for r in killed) if killed else float("nan")
    pct = 100.0 * len(killed) / n if n else 0.0
    return f"killed {len(killed)}/{n} ({pct:.0f}%), median kill time {median:.1f} s"


def line(r: Result) -> str:
    what = r.status if r.status != "survived" or r.applied is not False else "survived (never applied)"
    family = f" by {r.family}" if r.family else ""
    return f"{r.name:<34} {r.level:<7} {r.kind:<16} {what}{family} ({r.seconds:.1f} s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", metavar="NAME,...", help="these mutants only (comma-separated)")
    ap.add_argument("--fast", action="store_true", help=f"the subset CI runs: {', '.join(FAST)}")
    ap.add_argument("--jobs", type=int, default=1, metavar="K", help="mutants run in parallel (default 1)")
    ap.add_argument("--json", metavar="F", help="also write the report as JSON")
    ap.add_argument("--timeout", type=float, default=900.0, metavar="S", help="per mutant (default 900)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name:<34} {m.level:<7} {m.kind:<16} {m.what}")
        return 0
    names = list(FAST) if args.fast else list(MUTANTS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in MUTANTS]
        if unknown:
            ap.error(f"no mutant {', '.join(unknown)} (--list lists them)")
    print(f"{len(names)} mutants, {args.jobs} at a time", flush=True)
    done: list[Result] = []

    def write(results: list[Result], complete: bool) -> None:
        if args.json:  # after each mutant too, so a run cut short keeps what it found
            data = {"score": score(results), "complete": complete, "of": len(names)}
            data["results"] = [asdict(r) for r in results]
            Path(args.json).write_text(json.dumps(data, indent=2) + "\n")

    def progress(r: Result) -> None:
        print(line(r), flush=True)
        done.append(r)
        write(done, False)

    results = run_all(names, args.jobs, args.timeout, progress=progress)
    print(score(results))
    write(results, True)
    return 0 if all(r.status == "killed" for r in results) else 1
