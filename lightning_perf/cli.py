"""The ``lightning-perf`` command: a thin argparse layer over compare, report, bench, matrix and run."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Set, Tuple, TextIO

from lightning_perf.bench.rounds import DEFAULT_REPEATS, NothingFinished
from lightning_perf.bench.sequential import DEFAULT_BUDGET_S as SEQ_BUDGET_S
from lightning_perf.bench.sequential import DEFAULT_EQUIVALENCE_PCT as SEQ_SAME_PCT
from lightning_perf.bench.sequential import DEFAULT_MAX_ROUNDS as SEQ_MAX_ROUNDS
from lightning_perf.bench.sweep_rounds import DEFAULT_ROUNDS
from lightning_perf.measure.trials.blocks import BUILT_IN_CHANGES
from lightning_perf.measure.trials.spec import SWITCH_FORMS, is_switch_spec, parse_switch_spec
from lightning_perf.summary.io import probe_folder, special_kind
from lightning_perf.summary.schema import SummaryError

EXIT_OK, EXIT_SLOWER, EXIT_ERROR = 0, 1, 2
#: The exit status when stdout or stderr was closed before everything was written to it (``| head``): 128 + SIGPIPE,
#: what a shell reports for a command that SIGPIPE ended. Never 0: a reader that went away is no pass.
EXIT_PIPE = 128 + 13
DEFAULT_BENCH_CSV = os.path.join("runs", "bench.csv")

#: The standard streams ("stdout", "stderr") found closed during this ``main`` call.
_closed_streams: Set[str] = set()


class _Parser(argparse.ArgumentParser):
    #: (name, help) of each command, on the top-level parser only: listed when no command is given.
    commands: Tuple[Tuple[str, str], ...] = ()

    def error(self, message: str) -> None:  # one line, exit 2, as for a bad file
        if self.commands and "the following arguments are required" in message:  # only COMMAND is, up here
            self.exit(EXIT_ERROR, self.format_usage() + f"{self.prog}: error: no command given; the commands:\n"
                      + _command_list(self.commands) + f"\nRun '{self.prog} COMMAND --help' for a command's options.\n")
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")

    def print_help(self, file: Optional[TextIO] = None) -> None:  # `--help | head -1`: as any output, quietly
        _write_stream(self.format_help(), file or sys.stdout, newline=False)

    def print_usage(self, file: Optional[TextIO] = None) -> None:
        _write_stream(self.format_usage(), file or sys.stdout, newline=False)


class _Version(argparse.Action):
    """``--version``: one line on stdout, ``lightning-perf 0.1.0``, and exit 0 (argparse's own ``version`` action
    needs the text at parser build time and prints it through ``print_message``; this one goes through ``_say``)."""

    def __init__(self, option_strings: List[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from lightning_perf import __version__

        _say(f"lightning-perf {__version__}")
        parser.exit(EXIT_OK)


def _command_list(commands: Tuple[Tuple[str, str], ...]) -> str:
    import textwrap

    return "\n".join(textwrap.fill(help_text.replace("%%", "%"), width=100, initial_indent=f"  {name:<15}",
                                    subsequent_indent=" " * 17) for name, help_text in commands)


def _bounded(text: str, convert: Any, allowed: Any, expected: str) -> Any:
    """``convert(text)`` where ``allowed`` says yes; else one statement of the range, whatever is wrong with the
    value (not a number, NaN, out of range)."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not allowed(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _repeats_or_auto(text: str) -> Any:
    """``auto`` (rounds until decided) or a whole number of rounds >= 1."""
    if text.strip().lower() == "auto":
        return "auto"
    return _bounded(text, int, lambda v: v >= 1, "auto or an integer >= 1")


#: ``--budget``'s units: a number of seconds, or minutes / hours with ``m`` / ``h``.
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """Seconds from ``600``, ``600s``, ``10m`` or ``1.5h``: a finite number > 0."""
    body = text.strip().lower()
    number = body.rstrip("acdefghijklmnopqrstuvwxyz")
    unit = body[len(number):]
    scale = _DURATION_UNITS.get(unit)

    def seconds(_: str) -> Optional[float]:
        return float(number) * scale if scale is not None else None

    return _bounded(text, seconds, lambda v: math.isfinite(v) and v > 0,
                    "seconds or a duration such as 90s, 10m or 1.5h, finite and > 0")


def _non_negative_float(text: str) -> float:
    return _bounded(text, float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def _positive_float(text: str) -> float:
    return _bounded(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def _check_output(path: str, flag: str) -> None:
    """An output file that cannot be written fails before the work, as exit 2, not as a traceback after it."""
    kind = special_kind(path)
    if kind == "a directory":
        raise SummaryError(f"{flag} {path!r} is a directory; expected a file path")
    if kind is not None:  # never opened: writing to a named pipe blocks, and a device is not ours to replace
        raise SummaryError(f"{flag} {path!r} is {kind}, not a regular file; write to a file path")
    try:
        if os.path.exists(path) and not os.access(path, os.W_OK):  # written in place, not replaced
            raise PermissionError(13, "permission denied")
        probe_folder(path)
    except (OSError, ValueError) as err:
        raise SummaryError(f"{flag} {path!r} cannot be written: {getattr(err, 'strerror', None) or err}") from None


def _write_text(path: str, flag: str, text: str) -> None:
    """Writes an output checked before the work; checked again, as something may have appeared there meanwhile."""
    kind = special_kind(path)
    if kind is not None:
        raise SummaryError(f"{flag} {path!r} is {kind}, not a regular file; nothing was written there")
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        raise SummaryError(f"{flag} {path!r} cannot be written: {err.strerror or err}") from None


def _non_negative_int(text: str) -> int:
    return _bounded(text, int, lambda v: v >= 0, "an integer >= 0")


def _positive_int(text: str) -> int:
    return _bounded(text, int, lambda v: v >= 1, "a positive integer")


def _threads(text: str) -> Any:
    from lightning_perf.bench.threads import parse_threads

    try:
        return parse_threads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, keep or a whole number of threads >= 1, got {text!r}")


#: ``--threads`` of matrix and race (lightning_perf/bench/threads.py).
THREADS_HELP = ("torch threads in every run: auto gives each run the cores other processes left free before the first"
                " round (torch's default where all were free, or where OMP_NUM_THREADS is set); keep leaves torch's"
                " default; N sets N (default: auto)")


#: More iterations than any run makes; beyond it the time to N would overflow a float.
MAX_ITERATIONS = 10**15


def _iterations(text: str) -> int:
    too_many = f"expected a positive integer up to {MAX_ITERATIONS:.0e}, got"
    if len(text.strip()) > 20:  # int() of 400 digits works, float() of its product does not
        raise argparse.ArgumentTypeError(f"{too_many} a value of {len(text.strip())} characters")
    value = _positive_int(text)
    if value > MAX_ITERATIONS:
        raise argparse.ArgumentTypeError(f"{too_many} {text!r}")
    return value


def _add_sequential_options(p: argparse.ArgumentParser, same: str) -> None:
    """``--max-rounds`` and ``--same-within`` of ``--repeats auto`` (race and matrix); ``same``: who is decided the
    same, in the help."""
    p.add_argument("--max-rounds", type=_positive_int, default=None, metavar="N",
                   help=f"with --repeats auto, at most N rounds (default: {SEQ_MAX_ROUNDS})")
    p.add_argument("--same-within", type=_positive_float, default=SEQ_SAME_PCT, metavar="PCT",
                   help=f"with --repeats auto, {same} decided the same (default: {SEQ_SAME_PCT:g})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lightning-perf",
                     description="Compare and tabulate lightning_perf summary files; sweep models and variants;"
                     " attach the suite to a training command.")
    parser.add_argument("--version", action=_Version, help="print the version of lightning-perf and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    commands: List[Tuple[str, str]] = []

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        commands.append((name, help_text))
        return sub.add_parser(name, help=help_text)

    p = add("compare", "compare two runs: speedup with a 95%% CI, time saved, memory, quality")
    p.add_argument("base", help="the baseline run's perf_summary.json")
    p.add_argument("candidate", help="the candidate run's perf_summary.json")
    p.add_argument("--iterations", type=_iterations, default=30000,
                   help=f"N for time to N iterations, at most {MAX_ITERATIONS:.0e} (default: 30000)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text", help="(default: text)")
    p.add_argument("--names", nargs=2, metavar=("BASE", "CANDIDATE"), help="names to show for the two runs")
    p.add_argument("--html", metavar="FILE", help="also write the comparison and both runs as one self-contained HTML"
                   " file (docs/report_html.md)")
    p.add_argument("--base-repeats", nargs="+", metavar="SUMMARY",
                   help="more runs of the base's setup: with --candidate-repeats, the speedup and its 95%% CI come"
                   " from the spread between the runs, and only then is a change called significant")
    p.add_argument("--candidate-repeats", nargs="+", metavar="SUMMARY",
                   help="more runs of the candidate's setup (see --base-repeats)")
    p.add_argument("--min-effect", type=_non_negative_float, default=2.0, metavar="PCT",
                   help="a change smaller than PCT percent is called within noise even when the CI excludes 1"
                   " (default: 2)")
    p.add_argument(
        "--fail-if-slower",
        type=_non_negative_float,
        metavar="PCT",
        help="exit 1 when the candidate is more than PCT percent slower than the base (the headline speed), or when"
        " that cannot be decided (no measured iterations, no iteration_timer section, a run that did not complete,"
        " repeats included; samples per iteration known for one run only)"
        " (default: no gate)",
    )

    p = add("report", "one row per run: it/s, change vs the first, peak memory, quality")
    p.add_argument("runs", nargs="+", help="perf_summary.json files, the first is the reference row")
    p.add_argument("--names", nargs="+", help="a name per run (default: run.name, else the part of the paths that"
                   " differs)")
    p.add_argument("--notes", nargs="+", help="a free-text note per run (default: each run's run.notes)")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="(default: markdown)")
    p.add_argument("--change-vs", choices=("first", "previous"), default="first",
                   help="the row each change (speed, it/s, memory) is taken against: the first row or the row before"
                   " (default: first)")
    p.add_argument("--column", action="append", metavar="KEY",
                   help="add the last logged value of scalar KEY (the summary's `logged` block); repeatable")
    p.add_argument("--plot", metavar="PNG", help="also draw it/s, peak memory and quality per run")
    p.add_argument("--html", metavar="FILE", help="also write the report as one self-contained HTML file: the table,"
                   " bars, each run's sections, histogram, diagnosis and files (docs/report_html.md)")

    p = add("bench", "sweep a model over input sizes x batch sizes: time, throughput, memory")
    p.add_argument("--model", metavar="PKG.MODULE:FACTORY",
                   help="a callable returning an nn.Module or LightningModule (required unless --from-csv)")
    p.add_argument("--from-csv", metavar="CSV", help="no sweep: the table, analysis and --plot of an existing CSV")
    p.add_argument("--sweep", metavar="ID|all",
                   help="with --from-csv: the sweep to show ('all': every sweep, one plot line per sweep; default:"
                   " the latest in the file)")
    p.add_argument("--inputs", metavar="PKG.MODULE:BUILDER",
                   help="builder(batch_size, size, device) -> model input (default: images, torch.randn(batch, 3,"
                   " size, size))")
    p.add_argument("--input-sizes", type=_positive_int, nargs="+", default=[256, 384], metavar="N",
                   help="positive integers; every pair with a batch size is one configuration (default: 256 384)")
    p.add_argument("--batch-sizes", type=_positive_int, nargs="+", default=[1, 2, 4], metavar="N",
                   help="positive integers (default: 1 2 4)")
    p.add_argument("--mode", choices=("inference", "train"), default="inference", help="(default: inference)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="(default: cuda when available, else cpu)")
    p.add_argument("--precision", choices=("32", "16", "bf16"), default="32",
                   help="16 and bf16 run the forward under torch.autocast (default: 32)")
    p.add_argument("--warmup", type=_non_negative_int, default=None, metavar="N",
                   help="untimed iterations per configuration, >= 0 (default: 10 inference, 5 train)")
    p.add_argument("--iters", type=_positive_int, default=None, metavar="N",
                   help="timed iterations per configuration, >= 1 (default: 50 inference, 20 train)")
    p.add_argument("--rounds", type=_positive_int, default=DEFAULT_ROUNDS, metavar="N",
                   help="measure every configuration N times, in interleaved rounds (one CSV row each); the noise of"
                   " the verdicts comes from the spread between rounds, and a sentence is said only where the"
                   f" intervals separate (default: {DEFAULT_ROUNDS})")
    p.add_argument("--csv", default=DEFAULT_BENCH_CSV,
                   help=f"append rows to this CSV, header only when new (default: {DEFAULT_BENCH_CSV})")
    p.add_argument("--no-csv", action="store_true", help="write no CSV")
    p.add_argument("--plot", metavar="PNG", help="draw the four panels (default: no plot)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    # default None, said as "on": Python 3.10's BooleanOptionalAction appends its own "(default: True)" otherwise
    p.add_argument("--oom-snapshot", action=argparse.BooleanOptionalAction, default=None,
                   help="on CUDA, run a configuration that ran out of memory once more with the allocator's history"
                   " recorded, and link the snapshot from its rows (at most 5 a sweep; the timed runs never record)"
                   " (default: on)")
    p.add_argument("--oom-snapshot-dir", metavar="DIR",
                   help="where the snapshots go, one folder per sweep (default: beside the CSV, runs/bench.csv ->"
                   " runs/bench_oom_snapshots; with --from-csv: where to look for them)")

    p = add("bench-compare", "two sweeps' CSVs: speed and memory change per configuration")
    p.add_argument("old", metavar="OLD", help="the earlier sweep's CSV")
    p.add_argument("new", metavar="NEW", help="the later sweep's CSV")
    p.add_argument("--old-sweep", metavar="ID|all", help="the sweep of OLD to compare (default: its latest; OLD and"
                   " NEW the same file: the sweep before its latest)")
    p.add_argument("--new-sweep", metavar="ID|all", help="the sweep of NEW to compare (default: its latest)")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="(default: markdown)")

    p = add("matrix", "run one LightningCLI training under named variants and report them")
    p.add_argument("--script", required=True, help="a LightningCLI script (run as: python SCRIPT fit ...)")
    p.add_argument("--config", help="its YAML config")
    p.add_argument("--variant", action="append", required=True, metavar="NAME[=OVERRIDES]",
                   help="a preset name, or name='--trainer.precision=bf16-mixed ...'; the first is the baseline")
    p.add_argument("--out", default="runs/matrix", help="one folder per variant (default: runs/matrix)")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="(default: markdown)")
    p.add_argument("--report", help="also write the report to this file, in markdown (default: none)")
    p.add_argument("--csv", help="also write the rows to this CSV (default: none)")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                   help="seconds per variant, a finite number > 0 (default: none, no limit)")
    p.add_argument("--repeats", type=_repeats_or_auto, default=DEFAULT_REPEATS, metavar="auto|N",
                   help="run the variants N rounds, interleaved (A B C, C B A, ...), each run a fresh process: the"
                   " speedups' intervals come from the spread between runs, and a variant is decided faster or slower"
                   " only beyond the A/A noise floor; 1 decides nothing. 5 finds a 10%% change in ~90%% of trials"
                   " under 3%% drift between runs (see docs/cli.md); auto adds rounds until every variant is decided"
                   " (an always-valid interval, docs/bench.md) or --budget or --max-rounds ends them"
                   f" (default: {DEFAULT_REPEATS})")
    p.add_argument("--budget", type=_duration, default=None, metavar="DURATION",
                   help="start a round only when it is expected to end within DURATION (seconds, or 90s, 10m, 1.5h)"
                   " of the matrix's start (the longest round so far); the report says how many rounds ran (default:"
                   f" {SEQ_BUDGET_S / 60:g}m with --repeats auto, else none, every round)")
    _add_sequential_options(p, "a variant whose interval lies within +/-PCT%% of the baseline is")
    p.add_argument("--noise-floor", default="auto", metavar="auto|off|VARIANT",
                   help="the A/A pair: auto runs the baseline's setup again in the same rounds (as BASELINE_aa) unless"
                   " a variant has the baseline's overrides; VARIANT names the copy; off runs none (default: auto)")
    p.add_argument("--threads", type=_threads, default="auto", metavar="auto|keep|N", help=THREADS_HELP)
    p.add_argument("--best-by", choices=("end-to-end", "steady"), default="end-to-end",
                   help="rank Best by the whole fit at the run's length, warm-up and evaluation included, or by the"
                        " speed per measured iteration (default: end-to-end)")
    p.add_argument("--trial", type=_trial_change, metavar="CHANGE",
                   help="also try this change in an A/B trial inside each variant's fits (ABTrial, its defaults;"
                        " docs/trials.md), a column of each variant's in-run speedup pooled over its runs:"
                        f" {', '.join(BUILT_IN_CHANGES)}, or your own: {SWITCH_FORMS}, imported in the"
                        " command's Python (default: none)")

    p = add("race", "race two or more training commands in interleaved rounds, the suite attached to each run, and"
            " compare each with the first between runs")
    p.add_argument("--cmd", action="append", required=True, metavar="NAME=COMMAND",
                   help="a name and its command, e.g. 'baseline=python ../old/train.py --steps 200' (split as a shell"
                   " splits words, no shell run); the first is the baseline; give two or more")
    p.add_argument("--out", default=os.path.join("runs", "race"),
                   help="each run's summary in OUT/NAME/repeat_K/, the comparison in OUT/race.json (default:"
                   " runs/race)")
    p.add_argument("--repeats", type=_repeats_or_auto, default="auto", metavar="auto|N",
                   help="rounds, each command once a round in a fresh process: auto adds rounds until every command"
                   " is decided faster, slower or the same within --same-within against the first (an always-valid"
                   " interval, docs/bench.md), or --budget or --max-rounds ends them; N runs N rounds (default: auto)")
    p.add_argument("--budget", type=_duration, default=None, metavar="DURATION",
                   help="start a round only when it is expected to end within DURATION: seconds, or 90s, 10m, 1.5h"
                   f" (default: {SEQ_BUDGET_S / 60:g}m with --repeats auto, else none)")
    _add_sequential_options(p, "two commands whose interval lies within +/-PCT%% are")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                   help="seconds per run, a finite number > 0 (default: none, no limit)")
    p.add_argument("--noise-floor", default="auto", metavar="auto|off|NAME",
                   help="the A/A pair: auto runs the first command again in the same rounds (as NAME_aa) unless a"
                   " --cmd repeats it; NAME names the copy; off runs none (default: auto)")
    p.add_argument("--threads", type=_threads, default="auto", metavar="auto|keep|N", help=THREADS_HELP)
    p.add_argument("--together", action="store_true",
                   help="run each round's commands at the same time on the same cores (as many as --threads gives"
                   " each run, the least busy), a finished one's place kept busy to the round's end: they meet the"
                   " machine's changes alike, and only the ratios of their it/s compare; for CPU-bound training on"
                   " a shared machine (Linux; docs/bench.md, 'Together rounds') (default: one after the other)")
    p.add_argument("--callbacks", type=_callback_names, metavar="LIST",
                   help="as for run (default: IterationTimer, SectionProfiler, VRAMMonitor, EvalNoGradGuard)")
    p.add_argument("--min-effect", type=_non_negative_float, default=2.0, metavar="PCT",
                   help="a change below PCT%% is never decided (default: 2)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="(default: text)")
    p.add_argument("--report", help="also write the text report to this file (default: none)")

    p = add("run", "run a training command with the suite attached to every Trainer it builds, with no change to"
            " its code (the way to measure a baseline checkout)")
    p.add_argument("--out", metavar="DIR", help="folder of the summaries (with --name: DIR/NAME) (default: each"
                   " Trainer's log_dir, as callbacks given by hand)")
    p.add_argument("--name", help="the runs' run.name, and with --out the subfolder of DIR")
    p.add_argument("--callbacks", type=_callback_names, metavar="LIST",
                   help="comma-separated, from IterationTimer, SectionProfiler, VRAMMonitor, EvalNoGradGuard,"
                   " QualityGate (default: the first four, PerfSuite's)")
    p.add_argument("--baseline", metavar="FILE", help="also gate quality against this perf_summary.json or baseline"
                   " file (QualityGate, every metric it holds, warn only; default: none)")
    p.add_argument("--trial", type=_trial_change, metavar="CHANGE",
                   help="also try this change in an A/B trial inside each fit (ABTrial, its defaults; docs/trials.md):"
                        f" {', '.join(BUILT_IN_CHANGES)}, or your own: {SWITCH_FORMS}, imported in the"
                        " command's Python (default: none)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                   help="the command, e.g. -- python train.py --lr 0.1 (or python -m pkg.train ...)")
    parser.commands = tuple(commands)
    return parser


def _trial_change(text: str) -> str:
    """A built-in change, or the form of the user's switches by import path (imported later, where training runs)."""
    if text in BUILT_IN_CHANGES:
        return text
    built_in = ", ".join(repr(name) for name in BUILT_IN_CHANGES)
    if not is_switch_spec(text):
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {built_in}, or a change of your"
                                         f" own: {SWITCH_FORMS})")
    try:
        parse_switch_spec(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{err}; or a built-in change: {built_in}") from None
    return text


def _callback_names(text: str) -> List[str]:
    from lightning_perf._attach import parse_callbacks

    try:
        return parse_callbacks(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: The longest --name: it names a folder, and file systems refuse names over 255 bytes.
MAX_RUN_NAME = 100


def _cmd_run(args: argparse.Namespace) -> int:
    from lightning_perf._attach import SUMMARY_NAME, gate_arguments
    from lightning_perf._attach.launch import run_command

    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise SummaryError("run needs the command to run after --, e.g. lightning-perf run -- python train.py")
    name = args.name
    if name is not None and (not name.strip() or name in (os.curdir, os.pardir) or "\0" in name
                             or any(sep and sep in name for sep in (os.sep, os.altsep, "/", "\\"))
                             or len(name) > MAX_RUN_NAME):
        raise SummaryError(f"--name {name[:MAX_RUN_NAME]!r}: expected a folder name (no path separator, not '.' or"
                           f" '..', 1 to {MAX_RUN_NAME} characters)")
    out = None
    if args.out is not None:
        out = os.path.abspath(os.path.join(args.out, name) if name else args.out)
        if os.path.lexists(out) and not os.path.isdir(out):
            raise SummaryError(f"--out {out!r} is {special_kind(out) or 'a file'}; expected a folder")
        try:
            probe_folder(os.path.join(out, SUMMARY_NAME))
        except (OSError, ValueError) as err:
            raise SummaryError(f"--out {out!r} cannot be written: {getattr(err, 'strerror', None) or err}") from None
    baseline = None
    if args.baseline is not None:
        baseline = os.path.abspath(args.baseline)
        try:
            gate_arguments(baseline)
        except (OSError, ValueError) as err:
            raise SummaryError(f"--baseline {args.baseline!r}: {_baseline_problem(baseline, err)}") from None
    return run_command(command, callbacks=args.callbacks, out=out, name=name, baseline=baseline,
                       say=lambda text: _say(text, sys.stderr), trial=args.trial)


def _empty_file(path: str) -> bool:
    """True for a regular file that holds nothing but whitespace (what is not a regular file is never opened)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 4096:
            return False
        with open(path, "rb") as fh:
            return not fh.read().strip()
    except (OSError, ValueError):
        return False


def _baseline_problem(path: str, err: Exception) -> str:
    """Why ``run --baseline`` refuses ``path``: an empty file, or a JSON that is neither a summary nor a baseline
    file, said as such rather than by the first metric the gate could not use."""
    from lightning_perf.summary.baseline import BASELINE_KIND
    from lightning_perf.summary.io import read_json

    expected = "expected a perf_summary.json with a quality_gate section or a file written by record_baseline"
    if _empty_file(path):
        return f"the file is empty; {expected}"
    try:  # the checked reader: /dev/zero or a named pipe is refused, never opened (read whole, neither ends)
        data = read_json(path)
    except SummaryError:
        return str(err)
    if not isinstance(data, dict) or ("schema_version" not in data and data.get("kind") != BASELINE_KIND):
        return (f"not a summary or baseline file (neither a schema_version nor kind {BASELINE_KIND!r}); {expected}")
    return str(err)


#: ``_say``'s default stream: ``sys.stdout`` as it is when the line is written.
_STDOUT: Any = object()


def _say(text: str, stream: Any = _STDOUT) -> None:
    """Prints ``text`` whatever the stream can encode: a run name with a lone surrogate or a character outside the
    terminal's encoding is shown with a replacement character, not answered with UnicodeEncodeError. A line for
    stderr never goes to stdout, also where the process has no stderr (``2>&-``: ``sys.stderr`` is None)."""
    name = "stdout" if stream is _STDOUT else _stream_name(stream)
    stream = sys.stdout if stream is _STDOUT else stream
    if stream is None:
        _write_stream(text, stream, name=name)
        return
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        try:
            text = text.encode(encoding, errors="replace").decode(encoding, errors="replace")
        except LookupError:
            text = text.encode("ascii", errors="replace").decode("ascii")
    _write_stream(text, stream, name=name)


def _stream_name(stream: Optional[TextIO]) -> Optional[str]:
    return "stderr" if stream is sys.stderr else "stdout" if stream is sys.stdout else None


def _write_stream(text: str, stream: Optional[TextIO], newline: bool = True, name: Optional[str] = None) -> None:
    """Writes ``text`` and flushes it now, so that a reader that went away (``| head -1``) is found here and not by
    the interpreter's flush at exit. A closed stdout or stderr is then dropped quietly: what follows for it is not
    written, and the command goes on with its other work (files it was asked to write, a gate's decision). A
    stream the process started without (``>&-``: None) counts as closed."""
    name = name or _stream_name(stream)
    if name in _closed_streams:
        return
    if stream is None:
        if name is not None:
            _closed_streams.add(name)
        return
    try:
        stream.write(text + "\n" if newline else text)
        stream.flush()
    except BrokenPipeError:
        if name is None:
            raise
        _drop_stream(name)


def _drop_stream(name: str) -> None:
    """Python's recipe for a closed pipe (the ``signal`` module's note on SIGPIPE): the stream's file descriptor is
    pointed at devnull, so that the interpreter's final flush of what is still buffered does not raise again."""
    _closed_streams.add(name)
    try:
        fd = getattr(sys, name).fileno()
    except (AttributeError, OSError, ValueError):  # a stream with no descriptor (io.StringIO) has nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stream("stdout")
    except (AttributeError, ValueError):  # a stream replaced or already closed by the caller
        pass


def _cmd_compare(args: argparse.Namespace) -> int:
    from lightning_perf.summary.compare import (FORMATTERS, compare_summaries, default_names, distinct_runs,
                                                labelled_runs)
    from lightning_perf.summary.fields import fixed
    from lightning_perf.summary.io import read_summary

    base, candidate = read_summary(args.base), read_summary(args.candidate)
    if args.html:
        _check_output(args.html, "--html")
    # every run of each side as (path, where it was given, summary); a run given twice is counted once
    sides, dropped = distinct_runs({
        "base": [(args.base, "BASE", base)]
        + [(path, "--base-repeats", read_summary(path)) for path in args.base_repeats or []],
        "candidate": [(args.candidate, "CANDIDATE", candidate)]
        + [(path, "--candidate-repeats", read_summary(path)) for path in args.candidate_repeats or []]})
    names = args.names or default_names(args.base, args.candidate, [base, candidate])
    result = compare_summaries(base, candidate, iterations=args.iterations, base_name=names[0],
                               candidate_name=names[1], min_effect_pct=args.min_effect,
                               base_repeats=[r[2] for r in sides["base"][1:]],
                               candidate_repeats=[r[2] for r in sides["candidate"][1:]])
    result["notes"][:0] = dropped
    _say(FORMATTERS[args.format](result))
    if args.html:
        from lightning_perf.summary.html_report import compare_html

        _write_text(args.html, "--html", compare_html(base, candidate, result))
        _say(f"HTML written to {args.html}", sys.stderr)
    if args.fail_if_slower is None:
        return EXIT_OK
    # every run counts: a failed repeat must not let the gate pass on the others
    runs = labelled_runs([r[2] for r in sides["base"]], [r[2] for r in sides["candidate"]], *names)
    undecided = [f"{name} run status is {run.status!r} ({path})"
                 for (name, run), (path, _, _) in zip(runs, sides["base"] + sides["candidate"])
                 if run.status != "completed"]
    slower = result["candidate_slower_pct"]
    if slower is None or not math.isfinite(slower):
        undecided.append(next((n for n in result["notes"] if n.startswith("speedup unavailable")), "no speedup"))
    elif result["samples_per_iter_unknown"]:
        undecided.append(f"samples per iteration are unknown for {result['samples_per_iter_unknown'][0]} and known"
                         " for the other run: the it/s ratio is not known to be like for like")
    if undecided:
        _say(f"lightning-perf: --fail-if-slower cannot decide: {'; '.join(undecided)}", sys.stderr)
        return EXIT_SLOWER
    if slower > args.fail_if_slower:
        _say(f"lightning-perf: candidate is {fixed(slower, '.1f')}% slower than base ({result['speedup_basis']};"
             f" limit {args.fail_if_slower:g}%)", sys.stderr)
        return EXIT_SLOWER
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from lightning_perf.summary.fields import run_names
    from lightning_perf.summary.io import read_summary
    from lightning_perf.summary.report import column_notes, format_report, report_rows

    if args.names and len(args.names) != len(args.runs):
        raise SummaryError(f"--names got {len(args.names)} names for {len(args.runs)} runs")
    if args.notes and len(args.notes) != len(args.runs):
        raise SummaryError(f"--notes got {len(args.notes)} notes for {len(args.runs)} runs")
    summaries = [read_summary(path) for path in args.runs]
    names = args.names or run_names(args.runs, summaries)
    if args.plot:
        _check_output(args.plot, "--plot")
    if args.html:
        _check_output(args.html, "--html")
    rows = report_rows(summaries, names, args.notes, change_vs=args.change_vs, columns=args.column)
    notes = column_notes(summaries, names, args.column)
    _say(format_report(rows, args.format, notes))
    if notes and args.format == "csv":  # stdout stays CSV
        _say("\n".join(f"lightning-perf: {note}" for note in notes), sys.stderr)
    if args.html:
        from lightning_perf.summary.html_report import report_html

        _write_text(args.html, "--html", report_html(summaries, names, args.notes, args.change_vs, args.column, notes))
        _say(f"HTML written to {args.html}", sys.stderr)
    if args.plot:
        from lightning_perf.bench.plots import plot_label, plot_report

        labels = [plot_label(name) for name in names]  # the table above keeps the whole names
        if len(set(labels)) < len(labels):  # a bar per run, even where two names read alike once escaped or cut
            labels = [f"{label} ({i})" for i, label in enumerate(labels, start=1)]
        try:
            plot_report([dict(row, run=label) for row, label in zip(rows, labels)], args.plot)
        except (ValueError, OverflowError, RuntimeError, OSError) as err:
            raise SummaryError(f"--plot {args.plot!r}: cannot draw the report: {_one_line(err)}") from None
        _say(f"plot written to {args.plot}", sys.stderr)
    return EXIT_OK


def _one_line(err: BaseException, limit: Optional[int] = 300) -> str:
    """An error's text on one line (a file name may hold a line break); cut at ``limit`` characters where the text
    is not ours (ours name short values already)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


def _read_bench_csv(path: str, what: str) -> List[Dict[str, Any]]:
    """:func:`~lightning_perf.bench.analysis.read_csv`, its errors naming the argument (``--from-csv 'x.csv': no
    such file``), a folder or an empty file said as such."""
    from lightning_perf.bench.analysis import read_csv
    from lightning_perf.bench.sweep import BenchError

    kind = special_kind(path)
    if kind == "a directory":
        raise BenchError(f"{what} {path!r} is a directory; expected a bench CSV file")
    if kind is not None:  # never opened: /dev/zero reads forever, a named pipe blocks until a writer comes
        raise BenchError(f"{what} {path!r} is {kind}, not a regular file; expected a bench CSV file")
    if _empty_file(path):
        raise BenchError(f"{what} {path!r}: the file is empty; expected a CSV written by lightning-perf bench")
    try:
        return read_csv(path)
    except BenchError as err:  # its messages start with the path
        raise BenchError(f"{what} {err}") from None


def _missing_folders(path: str) -> List[str]:
    """The folders above ``path`` that do not exist yet: checking an output creates them, as its writer would."""
    missing = []
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


def _remove_empty_folders(folders: List[str]) -> None:
    """Removes the folders a failed command created, deepest first, each only while it is empty."""
    for folder in sorted(set(folders), key=len, reverse=True):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def _cmd_bench(args: argparse.Namespace) -> int:
    from lightning_perf.bench.analysis import analysis, select_sweep, sweep_ids
    from lightning_perf.bench.oom_snapshot import default_folder, saved_lines, unavailable_line
    from lightning_perf.bench.sweep import BenchError, FactoryError, format_table, load_callable, run_sweep
    from lightning_perf.bench.sweep_rounds import combine_rounds

    if args.sweep is not None and not args.from_csv:
        _say("lightning-perf: error: --sweep chooses among the sweeps of --from-csv CSV; a new sweep shows its own"
             " rows", sys.stderr)
        return EXIT_ERROR
    if args.from_csv:
        try:
            every = _read_bench_csv(args.from_csv, "--from-csv")
            rows = select_sweep(every, args.sweep)
            ids = sweep_ids(every)
            if args.sweep == "all":
                heading = f"all {len(ids)} sweep(s) in {args.from_csv}: {len(rows)} rows"
            else:
                k = ids.index(rows[0]["sweep_id"]) + 1
                heading = (f"sweep {rows[0]['sweep_id']}: {len(rows)} rows (sweep {k} of {len(ids)} in"
                           f" {args.from_csv}{', the latest' if k == len(ids) else ''}"
                           + ("; --sweep ID or --sweep all for the others)" if len(ids) > 1 else ")"))
            if args.plot:
                _check_output(args.plot, "--plot")
                from lightning_perf.bench.plots import plot_sweep

                plot_sweep(combine_rounds(rows), args.plot)
                _say(f"plot written to {args.plot}", sys.stderr)
        except (BenchError, ValueError) as err:
            _say(f"lightning-perf: error: {err}", sys.stderr)
            return EXIT_ERROR
        shown = combine_rounds(rows)
        links = saved_lines(rows, args.oom_snapshot_dir or default_folder(args.from_csv))
        _say(heading + "\n" + format_table(shown) + "\n\n" + analysis(shown) + "".join("\n" + t for t in links))
        return EXIT_OK
    if not args.model:
        _say("lightning-perf: error: bench needs --model PKG.MODULE:FACTORY (or --from-csv CSV)", sys.stderr)
        return EXIT_ERROR
    if args.no_csv:
        args.csv = None
    outputs = [(path, flag) for path, flag in ((args.csv, "--csv"), (args.plot, "--plot")) if path]
    created = [folder for path, _ in outputs for folder in _missing_folders(path)]
    try:
        for path, flag in outputs:
            _check_output(path, flag)
        factory = load_callable(args.model, "--model")
        builder = load_callable(args.inputs, "--inputs") if args.inputs else None
        if args.device is None:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.plot:
            from lightning_perf.bench.plots import _pyplot

            _pyplot()  # fail before the sweep, not after it
        rows = run_sweep(factory, args.input_sizes, args.batch_sizes, mode=args.mode, device=args.device,
                         precision=args.precision, warmup=args.warmup, iters=args.iters, input_builder=builder,
                         csv_path=args.csv, progress=not args.no_progress, rounds=args.rounds,
                         oom_snapshot=args.oom_snapshot is not False, oom_snapshot_dir=args.oom_snapshot_dir)
    except (BenchError, ValueError) as err:  # SummaryError too: an output that cannot be written
        _remove_empty_folders(created)  # bad input writes nothing, not even the folder the check made
        text = f"--model {args.model!r}: {err}" if isinstance(err, FactoryError) else str(err)
        _say(f"lightning-perf: error: {_one_line(text, limit=None)}", sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        _say("lightning-perf: interrupted; finished rows are in the CSV", sys.stderr)
        return 130
    shown = combine_rounds(rows)
    rounds = f" ({len(shown)} configurations x {args.rounds} interleaved rounds)" if args.rounds > 1 else ""
    links = saved_lines(rows, args.oom_snapshot_dir or default_folder(args.csv))
    links += [line for line in [unavailable_line(rows)] if line]
    _say(f"sweep {rows[0]['sweep_id']}: {len(rows)} rows{rounds}\n" + format_table(shown) + "\n\n" + analysis(shown)
         + "".join("\n" + t for t in links))
    if args.csv:
        _say(f"rows appended to {args.csv} (sweep {rows[0]['sweep_id']})", sys.stderr)
    if args.plot:
        from lightning_perf.bench.plots import plot_sweep

        plot_sweep(shown, args.plot)
        _say(f"plot written to {args.plot}", sys.stderr)
    failed = [r for r in rows if r["error"] and r["error"] != "OOM"]
    return 1 if failed else EXIT_OK


def _cmd_matrix(args: argparse.Namespace) -> int:
    from lightning_perf.bench.matrix import (
        check_outputs,
        format_matrix,
        matrix_header,
        matrix_rows,
        parse_variants,
        run_matrix,
        with_noise_floor,
    )
    from lightning_perf.bench.matrix_sequential import all_decided
    from lightning_perf.bench.matrix_trial import add_trial
    from lightning_perf.bench.what_would_decide import add_trial_lines

    auto = args.repeats == "auto"
    if args.max_rounds is not None and not auto:
        _say(f"lightning-perf: error: --max-rounds {args.max_rounds}: only with --repeats auto (--repeats"
             f" {args.repeats} runs {args.repeats} rounds)", sys.stderr)
        return EXIT_ERROR
    try:
        variants = parse_variants(args.variant)
    except ValueError as err:
        _say(f"lightning-perf: error: {err}", sys.stderr)
        return EXIT_ERROR
    for path, what, expected in ((args.script, "--script", "a LightningCLI script"),
                                 (args.config, "--config", "a YAML config file")):
        if path and os.path.isdir(path):
            _say(f"lightning-perf: error: {what} {path!r} is a directory; expected {expected}", sys.stderr)
            return EXIT_ERROR
        if path and special_kind(path) is not None:  # never opened: reading a named pipe blocks until a writer comes
            _say(f"lightning-perf: error: {what} {path!r} is {special_kind(path)}, not a regular file; expected"
                 f" {expected}", sys.stderr)
            return EXIT_ERROR
        if path and not os.path.isfile(path):
            _say(f"lightning-perf: error: {what} {path!r}: no such file", sys.stderr)
            return EXIT_ERROR
    for path, flag in ((args.report, "--report"), (args.csv, "--csv")):
        if path:
            _check_output(path, flag)
    try:
        variants, copy = with_noise_floor(variants, args.noise_floor)
        check_outputs(args.out, variants)
    except ValueError as err:
        _say(f"lightning-perf: error: {err}", sys.stderr)
        return EXIT_ERROR
    threads = _chosen_threads(args.threads, "matrix")
    try:
        until = (lambda sofar: all_decided(matrix_rows(sofar, noise_floor=copy, same_within_pct=args.same_within),
                                           args.best_by)) if auto else None
        results = run_matrix(args.script, variants, args.out, config=args.config, timeout_s=args.timeout,
                             log=lambda m: _say(m, sys.stderr),
                             repeats=(args.max_rounds or SEQ_MAX_ROUNDS) if auto else args.repeats,
                             budget_s=args.budget if args.budget is not None or not auto else SEQ_BUDGET_S,
                             threads=threads, trial=args.trial, until=until)
    except NothingFinished as stop:
        return _nothing_finished(stop, "matrix")
    rows = matrix_rows(results, noise_floor=copy, same_within_pct=args.same_within)
    header = matrix_header(results, args.config)
    add_trial(rows, results, args.trial)  # each variant's trial, pooled over its runs (bench/matrix_trial.py)
    add_trial_lines(rows, results, sys.executable, args.script, args.config)  # a switch within noise: its --trial line
    text = format_matrix(rows, args.format, header, best_by=args.best_by)
    _say(text)
    if args.report:
        _write_text(args.report, "--report", format_matrix(rows, "markdown", header, best_by=args.best_by) + "\n")
    if args.csv:
        _write_text(args.csv, "--csv", format_matrix(rows, "csv") + "\n")
    interrupted = _interrupted_status(next((r["rounds"] for r in results if r.get("rounds")), None))
    return interrupted or (EXIT_OK if all(r["status"] == "completed" for r in rows) else 1)


def _interrupted_status(rounds: Optional[Dict[str, Any]]) -> Optional[int]:
    """128 + N where a signal N (a Ctrl-C: SIGINT) ended the rounds early, as shells report a command it ended."""
    import signal

    if not rounds or not rounds.get("signal"):
        return None
    return 128 + int(getattr(signal, rounds["signal"]))


def _nothing_finished(stop: Any, what: str) -> int:
    """The rounds were interrupted before the first one finished: one line, no report, 128 + the signal."""
    _say(f"lightning-perf {what}: {stop}", sys.stderr)
    return _interrupted_status(stop.info) or EXIT_ERROR


def _chosen_threads(how: Any, what: str) -> Dict[str, Any]:
    """The thread count of every run (:mod:`lightning_perf.bench.threads`), said once before the first round."""
    from lightning_perf.bench.threads import choose_threads, threads_note

    choice = choose_threads(how)
    _say(f"[{what}] {threads_note(choice)}", sys.stderr)
    return choice


def _together_cores(threads: Dict[str, Any]) -> List[int]:
    """``race --together``'s cores: as many as each run has threads (all usable cores with torch's default), the
    least busy, said once before the first round."""
    from lightning_perf.bench.together import pick_cores

    cores = pick_cores(threads.get("threads"))
    _say(f"[race] --together: each round's commands run at once on core(s) {', '.join(map(str, cores))}",
         sys.stderr)
    return cores


def _cmd_race(args: argparse.Namespace) -> int:
    from lightning_perf.bench.race import (
        check_out,
        decided_race,
        format_race,
        parse_commands,
        race_ok,
        race_result,
        run_race,
        with_copy,
        write_result,
    )
    from lightning_perf.bench.together import can_pin

    auto = args.repeats == "auto"
    if args.together and not can_pin():
        raise SummaryError("--together: this platform cannot pin a process to cores (os.sched_setaffinity, Linux);"
                           " race without it")
    if args.max_rounds is not None and not auto:
        raise SummaryError(f"--max-rounds {args.max_rounds}: only with --repeats auto (--repeats {args.repeats} runs"
                           f" {args.repeats} rounds)")
    try:
        commands, copy = with_copy(parse_commands(args.cmd), args.noise_floor)
        check_out(args.out, commands)
    except ValueError as err:
        raise SummaryError(str(err)) from None
    if args.report:
        _check_output(args.report, "--report")
    until = decided_race(commands, copy, args.min_effect, args.same_within) if auto else None
    threads = _chosen_threads(args.threads, "race")
    together = _together_cores(threads) if args.together else None
    try:
        info = run_race(commands, args.out, (args.max_rounds or SEQ_MAX_ROUNDS) if auto else args.repeats,
                        budget_s=args.budget if args.budget is not None or not auto else SEQ_BUDGET_S,
                        timeout_s=args.timeout, callbacks=args.callbacks, log=lambda m: _say(m, sys.stderr),
                        threads=threads, until=until, together=together)
    except NothingFinished as stop:
        return _nothing_finished(stop, "race")
    result = race_result(commands, info, copy, min_effect_pct=args.min_effect, same_within_pct=args.same_within)
    write_result(result, os.path.join(args.out, "race.json"))
    text = format_race(result)
    _say(json.dumps(result, indent=2, default=str) if args.format == "json" else text)
    if args.report:
        _write_text(args.report, "--report", text + "\n")
    return _interrupted_status(info) or (EXIT_OK if race_ok(result) else 1)


def _cmd_bench_compare(args: argparse.Namespace) -> int:
    from lightning_perf.bench.analysis import compare_bench, format_bench_compare, select_sweep, sweep_ids
    from lightning_perf.bench.sweep import BenchError
    from lightning_perf.summary.fields import csv_text

    try:
        old_rows, new_rows = _read_bench_csv(args.old, "OLD"), _read_bench_csv(args.new, "NEW")
        old_sweep = args.old_sweep
        if old_sweep is None and args.new_sweep is None and os.path.samefile(args.old, args.new):
            ids = sweep_ids(old_rows)  # one appended CSV: the latest sweep against the one before it
            old_sweep = ids[-2] if len(ids) > 1 else None
        old = select_sweep(old_rows, old_sweep, "--old-sweep")
        new = select_sweep(new_rows, args.new_sweep, "--new-sweep")
        rows = compare_bench(old, new)
    except BenchError as err:
        _say(f"lightning-perf: error: {err}", sys.stderr)
        return EXIT_ERROR
    _say(csv_text(rows) if args.format == "csv" else format_bench_compare(rows))
    return EXIT_OK


COMMANDS = {"compare": _cmd_compare, "report": _cmd_report, "bench": _cmd_bench, "bench-compare": _cmd_bench_compare,
            "matrix": _cmd_matrix, "race": _cmd_race, "run": _cmd_run}


#: Commands that only read summaries: whatever a file holds, they answer with one line, never a traceback.
READERS = ("compare", "report")


def main(argv: Optional[List[str]] = None) -> int:
    """The command. A closed stdout or stderr (``| head -1``) ends nothing with a message or a traceback: what was
    left to print there is dropped, the rest of the work (files asked for, a gate's decision) is done, and the exit
    status is the command's own when it is not 0, else :data:`EXIT_PIPE`."""
    _closed_streams.clear()
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a bad option (one line, exit 2)
        _flush_stdout()
        if _closed_streams and exit_.code in (0, None):
            raise SystemExit(EXIT_PIPE) from None
        raise
    try:
        status = _dispatch(args)
    except BrokenPipeError:  # a write not through _say (a progress bar on a closed stderr): the same quiet end
        _flush_stdout()
        return EXIT_PIPE
    _flush_stdout()
    if args.command == "run":  # its exit status is the command's, whatever became of run's own few lines
        return status
    return EXIT_PIPE if _closed_streams and status == EXIT_OK else status


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return COMMANDS[args.command](args)
    except SummaryError as err:
        _say(f"lightning-perf: error: {_one_line(err, limit=None)}", sys.stderr)
        return EXIT_ERROR
    except (RecursionError, MemoryError) as err:
        _say(f"lightning-perf: error: the input is too large or too deeply nested to read ({type(err).__name__})",
             sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        raise
    except Exception as err:  # noqa: BLE001 - the last line of defence: a reader's bug is one line and exit 2
        if args.command not in READERS:
            raise
        _say(f"lightning-perf: error: internal error while reading the summaries ({type(err).__name__}:"
             f" {_one_line(err)}); please report it", sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
