"""``python -m conformance.campaign``: a long conformance campaign over every core, or a Ray cluster.

    python -m conformance.campaign --examples 1000000 --workers 16 [--target llvm_cpu.0] [--out DIR]
    python -m conformance.campaign --examples 1000000 --ray auto          # on a Ray cluster

The examples are split over the families and targets, then into **chunks** of ``--chunk``
examples (one family, one target, a seed derived from ``--seed``, the family, the target and the
chunk's place in the plan). Each chunk is one task: a worker process runs many of them in turn
without starting pytest (``conformance.campaign_worker``), so the cost per example is the suite's
own (drawing, interpreter, compile, run), not pytest's start-up. This is the campaign's shard; the
suite's ``--conformance-shard=I/N`` is not used, because there every shard draws and interprets
every example to keep Hypothesis's draws alike, so N workers would pay the interpreter N times.

Counts and fingerprints merge as ``report.Stats`` merges xdist workers: the fingerprint of a row
is the XOR of its chunks', each fixed by the plan, so any number of workers (one included) gives
the same counts and fingerprints for the same ``--examples``, ``--chunk`` and ``--seed``.

A chunk stops at its first failing example (Hypothesis shrinks it); the others go on. Failures are
grouped by signature (family, the first bad pass ``conformance.bisect`` finds, the kind of
failure, the operations of the shrunk program) in ``DIR/campaign.json`` and the readable
``DIR/campaign.txt``, with every failure folder under ``DIR/failures/`` and the throughput
(examples/s, and per core).

With ``--ray ADDRESS`` (``pip install 'tile[campaign]'``; ``auto`` joins the cluster ``ray start``
made on this machine), each chunk is a Ray task on the cluster; every machine needs this checkout
installed (``pip install -e .``) and the devices it tests.

A campaign too long for one sitting runs in pieces: ``--first-chunk F --chunks C`` runs that slice of
the plan, and ``--seconds S`` starts no chunk after S seconds (chunks start in plan order and the
running ones finish, so a run always covers a contiguous range: its report names the next
``--first-chunk``). ``python -m conformance.campaign --merge A B ... --out DIR`` merges the pieces'
``campaign.json`` (same plan: examples, chunk, seed, families, targets; disjoint ranges) into the
counts and fingerprint one unsharded run of those chunks gives, and says whether the whole plan is
covered. Coverage's distinguishing examples (``--distinguish K``, default 0: a chunk would seek K
per operation anew, a sixth of a worker's time) are left to the pytest run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from conformance import report
from conformance.campaign_worker import Chunk, run_chunk
from tile.errors import TileInputError

DEFAULT_CHUNK = 250  # examples per task: long enough that a task's overhead is small, short enough to balance


def plan(
    examples: int, families: list[str], targets: list[str], chunk: int, seed: int, distinguish: int = 0
) -> list[Chunk]:
    """The campaign's chunks: ``examples`` shared evenly over families x targets, in chunks of at
    most ``chunk``, interleaved so that every worker gets a mix of families."""
    pairs = [(f, t) for t in targets for f in families]
    per, extra = divmod(examples, len(pairs))
    rows = []
    for k, (family, target) in enumerate(pairs):
        total = per + (k < extra)
        sizes = [chunk] * (total // chunk) + ([total % chunk] if total % chunk else [])
        rows.append([(family, target, i, n) for i, n in enumerate(sizes)])
    chunks = []
    for i in range(max(map(len, rows), default=0)):
        for row in rows:
            if i < len(row):
                family, target, index, n = row[i]
                digest = hashlib.sha256(f"{seed}:{family}:{target}:{index}".encode()).digest()
                seed_k = int.from_bytes(digest[:8], "little")
                chunks.append(Chunk(family, target, index, n, seed_k, distinguish))
    return chunks


@dataclass
class Campaign:
    """The merged results of the chunks run so far."""

    out: Path
    stats: report.Stats = field(default_factory=report.Stats)
    signatures: dict = field(default_factory=lambda: defaultdict(list))  # signature -> [Found dicts]
    chunk_seconds: float = 0.0
    chunks: int = 0
    skipped: set = field(default_factory=set)

    def add(self, result: dict) -> None:
        self.stats.merge(result["stats"])
        self.chunk_seconds += result["seconds"]
        self.chunks += 1
        if result["skipped"]:
            c = result["chunk"]
            self.skipped.add((c["family"], c["target"], result["skipped"]))
        for found in result["found"]:
            folder = self.out / "failures" / found["folder"]
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in found["files"].items():
                (folder / name).write_bytes(data)
            key = (found["family"], found["culprit"], found["kind"], found["operations"])
            shown = {k: v for k, v in found.items() if k != "files"}
            self.signatures[key].append({**shown, "path": str(folder)})

    def fingerprint(self) -> str:
        """The XOR of every row's fingerprint (each row's is in ``rows``)."""
        x = 0
        for r in self.stats.rows.values():
            x ^= r.fingerprint
        return f"{x:016x}"

    def summary(self, seconds: float, workers: int, where: str, core_seconds: float | None = None) -> dict:
        """The report's data; ``core_seconds``: wall seconds times workers, summed over merged runs
        (default ``seconds * workers``)."""
        core_seconds = seconds * workers if core_seconds is None else core_seconds
        data = self.stats.summary("campaign", "chunks", seconds)
        compared = data["total"]["examples"]
        drawn = sum(r.examples + r.invalid + r.unsupported for r in self.stats.rows.values())
        data.pop("failures")
        data.update(
            where=where,
            workers=workers,
            chunks=self.chunks,
            fingerprint=self.fingerprint(),
            skipped=[{"family": f, "target": t, "reason": r} for f, t, r in sorted(self.skipped)],
            throughput={
                "examples_drawn": drawn,
                "examples_compared": compared,
                "wall_seconds": seconds,
                "chunk_seconds": self.chunk_seconds,
                "examples_per_second": drawn / seconds if seconds else 0.0,
                "examples_per_second_per_core": drawn / core_seconds if core_seconds else 0.0,
            },
            signatures=[
                {
                    "family": key[0],
                    "culprit": key[1],
                    "kind": key[2],
                    "operations": key[3],
                    "count": len(items),
                    "examples": [
                        {"folder": i["path"], "target": i["target"], "problem": i["problem"],
                         "reproduce": report.reproduce_command(i["path"], i["target"])}
                        for i in items
                    ],
                }  # fmt: skip
                for key, items in sorted(self.signatures.items(), key=lambda kv: -len(kv[1]))
            ],
        )
        return data


def text(data: dict) -> str:
    """The readable report (``campaign.txt``)."""
    t = data["throughput"]
    lines = [
        f"conformance campaign on {data['where']}: {data['workers']} worker(s), {data['chunks']} chunks, "
        f"{t['wall_seconds']:.1f} s",
        f"examples: {t['examples_drawn']} drawn, {t['examples_compared']} compared; "
        f"{t['examples_per_second']:.1f} examples/s, {t['examples_per_second_per_core']:.2f} examples/s/core",
        f"fingerprint: {data['fingerprint']}",
        _coverage_line(data["plan"]),
        "",
        f"{'family':<14}{'target':<24}{'examples':>9}{'invalid':>9}{'unsupp.':>9}{'failed':>8}{'seconds':>9}",
    ]
    for r in data["rows"]:
        lines.append(
            f"{r['family']:<14}{r['target']:<24}{r['examples']:>9}{r['invalid']:>9}{r['unsupported']:>9}"
            f"{r['failed']:>8}{r['seconds']:>9.1f}"
        )
    for s in data["skipped"]:
        lines.append(f"skipped {s['family']} on {s['target']}: {s['reason']}")
    sigs = data["signatures"]
    lines += ["", f"{len(sigs)} failure signature(s):" if sigs else "no failures"]
    for s in sigs:
        culprit = s["culprit"] or "culprit unknown"
        lines.append(f"  [{s['count']}x] {s['family']} | {culprit} | {s['kind']} | {s['operations']}")
        first = s["examples"][0]
        lines.append(f"      {first['problem'].splitlines()[0][:150]}")
        lines.append(f"      {first['reproduce']}")
    return "\n".join(lines) + "\n"


def _coverage_line(plan: dict) -> str:
    ranges = ", ".join(f"{a}-{b - 1}" for a, b in plan["ranges"]) or "none"
    done = sum(b - a for a, b in plan["ranges"])
    line = f"plan: chunks {ranges} of {plan['chunks']} ({done} run"
    nxt = _next_chunk(plan)
    if nxt is None:
        return line + "; the whole plan)"
    return line + f"; next: --first-chunk {nxt}, then --merge the reports)"


def _next_chunk(plan: dict) -> int | None:
    """The first chunk no range covers (None: the plan is covered)."""
    k = 0
    for a, b in sorted(plan["ranges"]):
        if a > k:
            break
        k = max(k, b)
    return k if k < plan["chunks"] else None


def _in_order(chunks: list[Chunk], limit: int, deadline: float | None, submit, next_done):
    """Each chunk's result as it completes, the chunks started in plan order with at most ``limit``
    running and none started after ``deadline`` (but the first); the running ones finish, so the
    chunks run are always the first n. ``submit(chunk) -> handle``; ``next_done(handles) ->
    (result, the handles still running)``."""
    todo, running, started = iter(chunks), [], 0
    while True:
        while len(running) < limit and (not started or deadline is None or time.perf_counter() < deadline):
            c = next(todo, None)
            if c is None:
                break
            running.append(submit(c))
            started += 1
        if not running:
            return
        result, running = next_done(running)
        yield result


def _local(chunks: list[Chunk], workers: int, deadline: float | None):
    if workers == 1:  # in this process (tests, profiling)
        yield from _in_order(chunks, 1, deadline, lambda c: c, lambda r: (run_chunk(r[0]), r[1:]))
        return
    import multiprocessing

    def next_done(running):
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        first = next(iter(done))
        return first.result(), [f for f in running if f is not first]

    ctx = multiprocessing.get_context("spawn")  # no LLVM or OpenCL state inherited from this process
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        # two per worker: a worker never waits for this process to hand it the next chunk
        yield from _in_order(chunks, 2 * workers, deadline, lambda c: pool.submit(run_chunk, c), next_done)


def _ray(chunks: list[Chunk], address: str, deadline: float | None):
    try:
        import ray
    except ImportError:
        raise SystemExit("error: --ray needs Ray: pip install 'tile[campaign]'") from None
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=1)(run_chunk)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def next_done(running):
        done, rest = ray.wait(running, num_returns=1)
        return ray.get(done[0]), rest

    yield from _in_order(chunks, 2 * cpus, deadline, remote.remote, next_done)


def run(
    examples: int,
    workers: int,
    out: Path,
    targets: list[str],
    families: list[str],
    chunk: int = DEFAULT_CHUNK,
    seed: int = 0,
    ray_address: str | None = None,
    progress=None,
    first_chunk: int = 0,
    chunks: int | None = None,
    seconds: float | None = None,
    distinguish: int = 0,
) -> dict:
    """Run a campaign, or the chunks ``first_chunk`` .. ``first_chunk + chunks - 1`` of its plan,
    starting none after ``seconds``; write ``out/campaign.json`` and ``out/campaign.txt``; return
    the summary (``plan``: the plan's parameters and the range run, for ``merge``)."""
    every = plan(examples, families, targets, chunk, seed, distinguish)
    todo = every[first_chunk : None if chunks is None else first_chunk + chunks]
    campaign = Campaign(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deadline = None if seconds is None else start + seconds
    results = _ray(todo, ray_address, deadline) if ray_address else _local(todo, workers, deadline)
    for k, result in enumerate(results, 1):
        campaign.add(result)
        if progress is not None:
            progress(k, len(todo), campaign)
    wall = time.perf_counter() - start
    if ray_address:
        import ray

        workers = int(ray.cluster_resources().get("CPU", 1))
    data = campaign.summary(wall, workers, f"Ray cluster {ray_address}" if ray_address else "this machine")
    ranges = [[first_chunk, first_chunk + campaign.chunks]] if campaign.chunks else []
    data["plan"] = {**_plan_key(examples, chunk, seed, families, targets, distinguish),
                    "chunks": len(every), "ranges": ranges, "core_seconds": wall * workers}  # fmt: skip
    data["stats"] = json.loads(campaign.stats.to_json())
    _write(out, data)
    return data


def _plan_key(examples, chunk, seed, families, targets, distinguish) -> dict:
    return {"examples": examples, "chunk": chunk, "seed": seed, "families": list(families),
            "targets": list(targets), "distinguish": distinguish}  # fmt: skip


def _write(out: Path, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "campaign.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "campaign.txt").write_text(text(data))


def merge(reports: list[Path], out: Path) -> dict:
    """The pieces' ``campaign.json`` (or their folders) as one campaign: the same counts and
    fingerprint as one run of the chunks they cover. ``TileInputError`` where the pieces are of
    different plans or overlap."""
    pieces = []
    for path in reports:
        path = path / "campaign.json" if path.is_dir() else path
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            hint = "give the campaign.json (or its folder) a campaign run wrote"
            raise TileInputError(f"cannot read campaign report {path}: {e}", None, hint) from None
        if "plan" not in data or "stats" not in data:
            raise TileInputError(f"{path} has no plan or stats to merge", None,
                                 "it was written before campaigns could be merged: run it again")  # fmt: skip
        pieces.append((path, data))
    if not pieces:
        raise TileInputError("nothing to merge", None, "give two or more campaign.json files or folders")
    key = {k: v for k, v in pieces[0][1]["plan"].items() if k not in ("ranges", "core_seconds")}
    for path, data in pieces[1:]:
        other = {k: v for k, v in data["plan"].items() if k not in ("ranges", "core_seconds")}
        differ = sorted(k for k in key if key[k] != other.get(k))
        if differ:
            same = "--examples, --chunk, --seed, --family, --target and --distinguish"
            hint = f"merge pieces run with the same {same}"
            what = f"{path} is of another campaign than {pieces[0][0]}: its {', '.join(differ)} differ"
            raise TileInputError(what, None, hint)
    ranges = sorted(tuple(r) for _, d in pieces for r in d["plan"]["ranges"])
    for (a0, b0), (a1, _) in zip(ranges, ranges[1:]):
        if a1 < b0:
            raise TileInputError(f"the pieces overlap: chunks {a0}-{b0 - 1} and {a1}-...", None,
                                 "merge each range of the plan once")  # fmt: skip
    campaign = Campaign(out)
    for _, data in pieces:
        campaign.stats.merge(json.dumps(data["stats"]))
        campaign.chunks += data["chunks"]
        campaign.chunk_seconds += data["throughput"]["chunk_seconds"]
        campaign.skipped |= {(s["family"], s["target"], s["reason"]) for s in data["skipped"]}
        for sig in data["signatures"]:
            items = [{"path": e["folder"], "target": e["target"], "problem": e["problem"]}
                     for e in sig["examples"]]  # fmt: skip
            campaign.signatures[(sig["family"], sig["culprit"], sig["kind"], sig["operations"])] += items
    wall = sum(d["throughput"]["wall_seconds"] for _, d in pieces)
    core = sum(d["plan"]["core_seconds"] for _, d in pieces)
    wheres = sorted({f"{d['where']} ({d['workers']} workers)" for _, d in pieces})
    merged = campaign.summary(wall, max(d["workers"] for _, d in pieces),
                              f"{len(pieces)} runs merged: " + "; ".join(wheres), core)  # fmt: skip
    merged["plan"] = {**key, "ranges": [list(r) for r in ranges], "core_seconds": core}
    merged["stats"] = json.loads(campaign.stats.to_json())
    _write(out, merged)
    return merged


def main(argv: list[str] | None = None) -> int:
    from conformance.strategies import FAMILIES

    p = argparse.ArgumentParser(prog="python -m conformance.campaign", description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, metavar="N", help="examples in all (the whole plan's)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="K",
                   help="worker processes (default: every core)")  # fmt: skip
    p.add_argument("--target", action="append", default=[], metavar="ID", help="device (repeatable)")
    p.add_argument("--family", action="append", default=[], choices=sorted(FAMILIES), help="(repeatable)")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, metavar="M", help="examples per task")
    p.add_argument("--seed", type=int, default=0, help="the campaign's seed (same seed, same examples)")
    p.add_argument("--out", type=Path, default=Path("campaign"), metavar="DIR", help="report folder")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster ('auto': the one on this machine)")
    p.add_argument("--first-chunk", type=int, default=0, metavar="F", help="run the plan from this chunk")
    p.add_argument("--chunks", type=int, metavar="C", help="run at most C chunks of the plan")
    p.add_argument("--seconds", type=float, metavar="S", help="start no chunk after S seconds")
    p.add_argument("--distinguish", type=int, default=0, metavar="K",
                   help="distinguishing examples sought per operation in each chunk (default 0)")  # fmt: skip
    p.add_argument("--merge", nargs="+", type=Path, metavar="REPORT",
                   help="merge these runs' campaign.json (or folders) into --out, run nothing")  # fmt: skip
    args = p.parse_args(argv)
    if args.merge:
        try:
            data = merge(args.merge, args.out)
        except TileInputError as e:
            p.error(f"{e.message} ({e.hint})")
        print(text(data), end="")
        print(f"report: {args.out / 'campaign.json'}, {args.out / 'campaign.txt'}")
        return 1 if data["signatures"] else 0
    if args.examples is None:
        p.error("--examples is required (or --merge REPORT ...)")
    if args.examples < 1 or args.workers < 1 or args.chunk < 1:
        p.error("--examples, --workers and --chunk must be at least 1")
    if args.first_chunk < 0 or (args.chunks is not None and args.chunks < 1) or args.distinguish < 0:
        p.error("--first-chunk and --distinguish must be at least 0, --chunks at least 1")
    from backends import registry
    from tile.errors import TileError

    targets = args.target or [d for d in registry.devices() if d != "interp"]
    for t in targets:
        try:
            registry.get(t)
        except TileError as e:
            p.error(f"--target {t}: {e.message} (`python -m tile devices` lists the devices)")
    if not targets:
        p.error(f"no compiled device to check: {registry.unavailable() or 'none registered'}")
    families = args.family or list(FAMILIES)
    total = len(plan(args.examples, families, targets, args.chunk, args.seed))
    if args.first_chunk >= total:
        p.error(f"--first-chunk {args.first_chunk}: the plan has {total} chunks (0-{total - 1})")

    def progress(k: int, n: int, c: Campaign) -> None:
        rows = c.stats.rows.values()
        done = sum(r.examples + r.invalid + r.unsupported for r in rows)
        failed = sum(len(v) for v in c.signatures.values())
        print(f"\r{k}/{n} chunks, {done} examples, {failed} failure(s)", end="", file=sys.stderr, flush=True)

    data = run(args.examples, args.workers, args.out, targets, families, args.chunk, args.seed, args.ray,
               progress, args.first_chunk, args.chunks, args.seconds, args.distinguish)  # fmt: skip
    print(file=sys.stderr)
    print(text(data), end="")
    print(f"report: {args.out / 'campaign.json'}, {args.out / 'campaign.txt'}")
    return 1 if data["signatures"] else 0


if __name__ == "__main__":
    sys.exit(main())
