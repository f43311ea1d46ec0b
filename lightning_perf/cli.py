"""The ``lightning-perf`` command: a thin argparse layer over compare and report."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from lightning_perf.summary.io import load_summary
from lightning_perf.summary.schema import SummaryError

EXIT_OK, EXIT_SLOWER, EXIT_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for a bad file
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lightning-perf", description="Compare and tabulate lightning_perf summary files.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("compare", help="compare two runs: speedup with a 95%% CI, time saved, memory, quality")
    p.add_argument("base", help="the baseline run's perf_summary.json")
    p.add_argument("candidate", help="the candidate run's perf_summary.json")
    p.add_argument("--iterations", type=_positive_int, default=30000, help="N for time to N iterations (30000)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--names", nargs=2, metavar=("BASE", "CANDIDATE"), help="names to show for the two runs")
    p.add_argument(
        "--fail-if-slower",
        type=_non_negative_float,
        metavar="PCT",
        help="exit 1 when the candidate's median ms/iter is more than PCT percent above the base's",
    )

    p = sub.add_parser("report", help="one row per run: it/s, change vs the first, peak memory, quality")
    p.add_argument("runs", nargs="+", help="perf_summary.json files, the first is the reference row")
    p.add_argument("--names", nargs="+", help="a name per run (default: each run's folder)")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    return parser


def _cmd_compare(args: argparse.Namespace) -> int:
    from lightning_perf.summary.compare import FORMATTERS, compare_summaries, default_names

    base, candidate = load_summary(args.base), load_summary(args.candidate)
    names = args.names or default_names(args.base, args.candidate)
    result = compare_summaries(base, candidate, iterations=args.iterations, base_name=names[0],
                               candidate_name=names[1])
    print(FORMATTERS[args.format](result))
    slower = result["candidate_slower_pct"]
    if args.fail_if_slower is not None and slower is not None and slower > args.fail_if_slower:
        print(
            f"lightning-perf: candidate is {slower:.1f}% slower than base (limit {args.fail_if_slower:g}%)",
            file=sys.stderr,
        )
        return EXIT_SLOWER
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from lightning_perf.summary.fields import run_name
    from lightning_perf.summary.report import format_report, report_rows

    if args.names and len(args.names) != len(args.runs):
        raise SummaryError(f"--names got {len(args.names)} names for {len(args.runs)} runs")
    summaries = [load_summary(path) for path in args.runs]
    names = args.names or [run_name(path) for path in args.runs]
    print(format_report(report_rows(summaries, names), args.format))
    return EXIT_OK


COMMANDS = {"compare": _cmd_compare, "report": _cmd_report}


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SummaryError as err:
        print(f"lightning-perf: error: {err}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
