"""``python -m conformance.mutants``: the default conformance run against each seeded defect.

Each mutant gets its own ``pytest conformance/test_conformance.py --target mutant:NAME -x`` (the
ci profile, the families in the order the default run has them; ``-x``: the first failing family
ends it), in a child process, so one that crashes takes only itself down. It is *killed* when a
family fails, and reported with the family and its kill time: the seconds from the start of the
child to its first failing example (``conformance.mutants.detect``: the detection), and besides it
the seconds the child took in all (Hypothesis shrinking the failing example, most of it);
*survived* when every family passed (``never applied``: its rewrite found nothing to change in any
program the suite compiled). ``--json F`` writes the same report as data.
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
from concurrent.futures import ThreadPoolExecutor, as_completed
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
    seconds: float  # the kill time: to the first failing example (else to the end of the run)
    total: float  # the whole child run, shrinking included
    applied: bool | None  # whether the rewrite changed any compiled program (None: not known)
    detail: str = ""  # the failing assertion's first line, or why the run ended


def command(name: str, workdir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "conformance/test_conformance.py", f"--target=mutant:{name}",
        "-x", "-q", "-rf", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "conformance.mutants.detect",
        f"--conformance-failures={workdir / 'failures'}", *extra,
    ]  # fmt: skip


def child_env() -> dict[str, str]:
    """The environment of a child run: ours, with bytecode cached outside the checkout. Where
    ``PYTHONDONTWRITEBYTECODE`` is set, every child would compile every module (and pytest rewrite
    every plugin's asserts) anew: a third of a child's start-up, before its first example."""
    env = dict(os.environ)
    if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None and "PYTHONPYCACHEPREFIX" not in env:
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "tile-mutants-pycache")
    return env


def first_detection(path) -> tuple[str, float] | None:
    """``(family, time.time())`` of the first failing example a child run noted, if any (the
    note ``conformance.mutants.detect`` writes: ``FAMILY TIME``)."""
    try:
        text = open(path).read().split()
    except OSError:
        return None
    return (text[0], float(text[1])) if len(text) >= 2 else None


def _child(cmd: list[str], env: dict, timeout: float, noted: Path, stop_at_detection: bool):
    """Run the child pytest; returns its output and exit code (None: timed out, or stopped at its
    first failing example with ``stop_at_detection``)."""
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        end = time.perf_counter() + timeout
        while child.poll() is None and time.perf_counter() < end:
            if stop_at_detection and first_detection(noted) is not None:
                break
            time.sleep(0.2)
        code = child.poll()
        if code is None:
            child.kill()
            child.wait()
        out.seek(0)
        return out.read(), code


def run_one(
    name: str, timeout: float = 900.0, extra: tuple[str, ...] = (), stop_at_detection: bool = False
) -> Result:
    """One mutant's conformance run, in a child process; ``stop_at_detection``: ended at its first
    failing example (no shrinking; the total is then the kill time)."""
    m = MUTANTS[name]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        workdir = Path(tmp)
        log, noted = workdir / "applied.log", workdir / "detected.log"
        env = {**child_env(), "TILE_MUTANT_LOG": str(log), "TILE_MUTANT_DETECT": str(noted)}
        start, wall = time.perf_counter(), time.time()
        out, code = _child(command(name, workdir, extra), env, timeout, noted, stop_at_detection)
        total = time.perf_counter() - start
        first = first_detection(noted)
        lines = log.read_text().split() if log.exists() else []
        applied = "applied" in lines if lines else None
    failed = _FAILED.search(out)
    if first is not None and (code is None or failed):  # killed (stopped at, or shrunk after, detection)
        status, family = "killed", failed.group(1) if failed else first[0]
        detail = next((ln[2:].strip() for ln in out.splitlines() if ln.startswith("E ")), "")
        detail = detail or "stopped at its first failing example"
    elif code is None:
        status, family, detail = "timeout", None, f"no verdict within {timeout:.0f} s"
    elif failed:
        status, family = "killed", failed.group(1)
        detail = next((ln[2:].strip() for ln in out.splitlines() if ln.startswith("E ")), "")
    elif code == 0:
        status, family, detail = "survived", None, ""
    else:  # pytest itself failed (a crash of the child, a usage error): the defect broke the run
        status, family = "killed", "crash"
        detail = f"pytest exited {code}: " + (out.strip().splitlines() or [""])[-1]
    seconds = first[1] - wall if first is not None and status == "killed" else total
    took = round(seconds, 1), round(total, 1)
    return Result(name, m.level, m.kind, status, family, *took, applied, detail[:200])


def run_all(
    names: list[str], jobs: int = 1, timeout: float = 900.0, progress=None, stop_at_detection: bool = False
) -> list[Result]:
    results: dict[str, Result] = {}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        runs = [pool.submit(run_one, n, timeout, stop_at_detection=stop_at_detection) for n in names]
        for done in as_completed(runs):  # reported as each ends, not held behind a slower one
            r = done.result()
            results[r.name] = r
            if progress is not None:
                progress(r)
    return [results[n] for n in names]


def score(results: list[Result]) -> str:
    killed = [r for r in results if r.status == "killed"]
    n = len(results)
    pct = 100.0 * len(killed) / n if n else 0.0
    if not killed:
        return f"killed 0/{n} (0%)"
    kill, total = [r.seconds for r in killed], [r.total for r in killed]
    return (
        f"killed {len(killed)}/{n} ({pct:.0f}%), kill time (to the first failing example) median "
        f"{statistics.median(kill):.1f} s, max {max(kill):.1f} s; with shrinking median "
        f"{statistics.median(total):.1f} s, max {max(total):.1f} s"
    )


def line(r: Result) -> str:
    what = r.status if r.status != "survived" or r.applied is not False else "survived (never applied)"
    family = f" by {r.family}" if r.family else ""
    took = f"{r.seconds:.1f} s" + (
        f", {r.total:.1f} s in all" if r.status == "killed" and r.total > r.seconds else ""
    )
    return f"{r.name:<34} {r.level:<7} {r.kind:<16} {what}{family} ({took})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", metavar="NAME,...", help="these mutants only (comma-separated)")
    ap.add_argument("--fast", action="store_true", help=f"the subset CI runs: {', '.join(FAST)}")
    ap.add_argument("--jobs", type=int, default=1, metavar="K", help="mutants run in parallel (default 1)")
    ap.add_argument("--json", metavar="F", help="also write the report as JSON")
    ap.add_argument("--timeout", type=float, default=900.0, metavar="S", help="per mutant (default 900)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument(
        "--stop-at-detection",
        action="store_true",
        help="end each run at its first failing example (no shrinking: quicker, the same verdicts)",
    )
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

    results = run_all(
        names, args.jobs, args.timeout, progress=progress, stop_at_detection=args.stop_at_detection
    )
    print(score(results))
    write(results, True)
    return 0 if all(r.status == "killed" for r in results) else 1
