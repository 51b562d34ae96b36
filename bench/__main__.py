"""``python -m bench report [RUN.json ...] [--png out.png] [--md out.md]``: the table of saved
benchmark runs (the newest under ``.benchmarks/`` when no file is named), optionally as Markdown
and as a plot of throughput against size."""

from __future__ import annotations

import argparse
import sys

from bench import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Reports of saved benchmark runs.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="table / Markdown / PNG of saved pytest-benchmark runs")
    rep.add_argument("runs", nargs="*", metavar="RUN.json", help="pytest-benchmark JSON files")
    rep.add_argument("--png", metavar="OUT.png", help="write a plot of throughput vs size (needs matplotlib)")
    rep.add_argument("--md", metavar="OUT.md", help="write the table as Markdown")
    args = parser.parse_args(argv)
    try:
        runs = args.runs or [str(report.latest_run())]
        rows = report.load(runs)
        if not rows:
            raise report.ReportError(f"no benchmark in {', '.join(runs)} recorded a rate (run bench/ suites)")
        print(report.table(rows))
        if args.md:
            with open(args.md, "w") as f:
                f.write(report.markdown(rows, runs))
            print(f"wrote {args.md}")
        if args.png:
            print(f"wrote {report.plot(rows, args.png)}")
    except report.ReportError as e:
        print(f"python -m bench report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
