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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from conformance import report
from conformance.campaign_worker import Chunk, run_chunk

DEFAULT_CHUNK = 250  # examples per task: long enough that a task's overhead is small, short enough to balance


def plan(examples: int, families: list[str], targets: list[str], chunk: int, seed: int) -> list[Chunk]:
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
                chunks.append(Chunk(family, target, index, n, int.from_bytes(digest[:8], "little")))
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

    def summary(self, seconds: float, workers: int, where: str) -> dict:
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
                "examples_per_second_per_core": drawn / seconds / workers if seconds else 0.0,
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


def _local(chunks: list[Chunk], workers: int, progress):
    if workers == 1:  # in this process (tests, profiling)
        for c in chunks:
            yield run_chunk(c)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no LLVM or OpenCL state inherited from this process
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for done in as_completed([pool.submit(run_chunk, c) for c in chunks]):
            yield done.result()


def _ray(chunks: list[Chunk], address: str, progress):
    try:
        import ray
    except ImportError:
        raise SystemExit("error: --ray needs Ray: pip install 'tile[campaign]'") from None
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=1)(run_chunk)
    pending = [remote.remote(c) for c in chunks]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield ray.get(done[0])


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
) -> dict:
    """Run a campaign; write ``out/campaign.json`` and ``out/campaign.txt``; return the summary."""
    chunks = plan(examples, families, targets, chunk, seed)
    campaign = Campaign(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = _ray(chunks, ray_address, progress) if ray_address else _local(chunks, workers, progress)
    for k, result in enumerate(results, 1):
        campaign.add(result)
        if progress is not None:
            progress(k, len(chunks), campaign)
    seconds = time.perf_counter() - start
    if ray_address:
        import ray

        workers = int(ray.cluster_resources().get("CPU", 1))
    data = campaign.summary(seconds, workers, f"Ray cluster {ray_address}" if ray_address else "this machine")
    (out / "campaign.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "campaign.txt").write_text(text(data))
    return data


def main(argv: list[str] | None = None) -> int:
    from conformance.strategies import FAMILIES

    p = argparse.ArgumentParser(prog="python -m conformance.campaign", description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, required=True, metavar="N", help="examples in all")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="K",
                   help="worker processes (default: every core)")  # fmt: skip
    p.add_argument("--target", action="append", default=[], metavar="ID", help="device (repeatable)")
    p.add_argument("--family", action="append", default=[], choices=sorted(FAMILIES), help="(repeatable)")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, metavar="M", help="examples per task")
    p.add_argument("--seed", type=int, default=0, help="the campaign's seed (same seed, same examples)")
    p.add_argument("--out", type=Path, default=Path("campaign"), metavar="DIR", help="report folder")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster ('auto': the one on this machine)")
    args = p.parse_args(argv)
    if args.examples < 1 or args.workers < 1 or args.chunk < 1:
        p.error("--examples, --workers and --chunk must be at least 1")
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

    def progress(k: int, n: int, c: Campaign) -> None:
        rows = c.stats.rows.values()
        done = sum(r.examples + r.invalid + r.unsupported for r in rows)
        failed = sum(len(v) for v in c.signatures.values())
        print(f"\r{k}/{n} chunks, {done} examples, {failed} failure(s)", end="", file=sys.stderr, flush=True)

    data = run(args.examples, args.workers, args.out, targets, args.family or list(FAMILIES), args.chunk,
               args.seed, args.ray, progress)  # fmt: skip
    print(file=sys.stderr)
    print(text(data), end="")
    print(f"report: {args.out / 'campaign.json'}, {args.out / 'campaign.txt'}")
    return 1 if data["signatures"] else 0


if __name__ == "__main__":
    sys.exit(main())
