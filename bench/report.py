"""Tables and plots from saved benchmark runs (``pytest --benchmark-json=RUN.json`` or
``--benchmark-autosave``), for ``python -m bench report``.

Each benchmark of ``bench/`` leaves its numbers in pytest-benchmark's ``extra_info`` (see
``bench.cases.record``): one row per benchmark and reference, so a run with PlaidML besides numpy
gives two rows. The plot has one panel per case family, throughput against size, a solid line per
target and a dashed one per reference. matplotlib is an optional extra (``pip install tile[plot]``)
imported only when a plot is asked for.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

COLUMNS = ("case", "size", "target", "rate", "unit", "reference", "reference rate", "ratio", "compile s")


class ReportError(Exception):
    """A problem with the report's inputs or its optional dependencies; main() prints it."""


@dataclasses.dataclass(frozen=True)
class Row:
    case: str
    size: int | None
    size_desc: str
    target: str
    rate: float
    unit: str
    reference: str
    reference_rate: float | None
    compile_s: float | None
    run: str  # the file it came from (its stem)

    @property
    def ratio(self) -> float | None:
        """Reference time / target time (the work is the same): above 1, faster than the reference."""
        return self.rate / self.reference_rate if self.reference_rate else None

    def cells(self) -> tuple[str, ...]:
        return (
            self.case,
            "" if self.size is None else str(self.size),
            self.target,
            _num(self.rate),
            self.unit,
            self.reference,
            _num(self.reference_rate),
            _num(self.ratio),
            _num(self.compile_s),
        )


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def load(paths: Iterable[str | Path]) -> list[Row]:
    """Rows of every benchmark with a recorded rate in the pytest-benchmark JSON files ``paths``,
    sorted by case, target and size; benchmarks without one (older runs, other suites) are left out."""
    rows = []
    for path in paths:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ReportError(f"cannot read {path}: {e}") from None
        if not isinstance(data, dict) or "benchmarks" not in data:
            raise ReportError(f"{path} is not a pytest-benchmark JSON file (no 'benchmarks')")
        for bench in data["benchmarks"]:
            rows.extend(_rows(bench, path.stem))
    return sorted(rows, key=lambda r: (r.case, r.target, r.run, r.size is None, r.size or 0))


def _rows(bench: dict, run: str) -> list[Row]:
    info = bench.get("extra_info") or {}
    if "rate" not in info:
        return []
    params = bench.get("params") or {}
    refs = info.get("references")
    if not refs:
        refs = {info.get("reference", "-"): info.get("reference_rate")}
    return [
        Row(
            case=info.get("case") or str(params.get("case", bench.get("name", "?"))),
            size=info.get("size"),
            size_desc=info.get("size_desc", "size"),
            target=info.get("target") or str(params.get("target", "?")),
            rate=float(info["rate"]),
            unit=info.get("unit", ""),
            reference=name,
            reference_rate=None if rate is None else float(rate),
            compile_s=info.get("compile_s"),
            run=run,
        )
        for name, rate in refs.items()
    ]


def table(rows: Sequence[Row]) -> str:
    """A plain-text table with aligned columns."""
    cells = [COLUMNS, *(r.cells() for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    numeric = {3, 6, 7, 8}
    lines = []
    for k, line in enumerate(cells):
        pad = [str.rjust if i in numeric and k else str.ljust for i in range(len(line))]
        parts = [f(c, w) for f, c, w in zip(pad, line, widths)]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: Sequence[Row], sources: Sequence[str] = ()) -> str:
    """A Markdown table; ``sources`` (the run files) are named above it."""
    out = []
    if sources:
        out += [f"Runs: {', '.join(f'`{s}`' for s in sources)}", ""]
    out.append("| " + " | ".join(COLUMNS) + " |")
    out.append("|" + "|".join("---:" if i in (1, 3, 6, 7, 8) else "---" for i in range(len(COLUMNS))) + "|")
    out += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(out) + "\n"


def plot(rows: Sequence[Row], path: str | Path) -> Path:
    """A PNG of throughput against size: a panel per case, a solid line per target (one per run
    file and target when several files are given), a dashed line per reference (its best rate
    at each size over the runs that measured it)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "the PNG plot needs matplotlib, an optional extra: pip install 'tile[plot]' "
            "(or pip install matplotlib); the table does not need it"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.size is not None]
    if not rows:
        raise ReportError("nothing to plot: no benchmark with a size")
    cases = sorted({r.case for r in rows})
    several_runs = len({r.run for r in rows}) > 1
    ncols = min(3, len(cases))
    nrows = math.ceil(len(cases) / ncols)
    labels = sorted({_label(r, several_runs) for r in rows}) + sorted({r.reference for r in rows})
    color = {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}  # the same in every panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        mine = [r for r in rows if r.case == case]
        targets: dict[str, dict[int, float]] = {}
        refs: dict[str, dict[int, float]] = {}
        for r in mine:
            targets.setdefault(_label(r, several_runs), {})[r.size] = r.rate
            if r.reference_rate:
                best = refs.setdefault(r.reference, {})
                best[r.size] = max(best.get(r.size, 0.0), r.reference_rate)
        for label, pts in sorted(targets.items()):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], "o-", label=label, color=color[label])
        for label, pts in sorted(refs.items()):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], "s--", label=label, color=color[label], alpha=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(case)
        ax.set_xlabel(mine[0].size_desc, fontsize=8)
        ax.set_ylabel(mine[0].unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(cases) :]:
        ax.set_visible(False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(row: Row, several_runs: bool) -> str:
    return f"{row.target} ({row.run})" if several_runs else row.target


def latest_run(root: str | Path = ".benchmarks") -> Path:
    """The newest JSON file that ``pytest --benchmark-autosave`` left under ``root``."""
    found = sorted(Path(root).glob("**/*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ReportError(
            f"no RUN.json given and none saved under {root}/: run "
            "`python -m pytest bench/ --benchmark-only --benchmark-json=RUN.json` first"
        )
    return found[-1]
