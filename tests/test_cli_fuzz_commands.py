"""Fuzz of the commands that run programs or read several files: `race`, `matrix`, compare's repeats options and
`report --html`.

Each call's argv is drawn, with a fixed seed, from valid and hostile tokens (bad numbers, special files, folders where
files belong, names that are not names, real and mutated summaries, duplicates). Every call answers with exit 0, 1 or
2, prints no traceback, ends before its alarm (no hang), and an exit 2 ends in one ``lightning-perf[ CMD]: error:`` line
(the readers print nothing else on stderr). `race` and `matrix` run cheap programs (``true``, a script that exits at
once), so a call is a fraction of a second.

``FUZZ_CALLS`` sets the calls per command (default 25 in the suite; ``FUZZ_CALLS=250`` gives 1,000 calls in all,
the issue's count: ``FUZZ_CALLS=250 .venv/bin/python -m pytest tests/test_cli_fuzz_commands.py -n 2``).
``FUZZ_SEED`` draws other calls (default ``63``, the suite's): ``FUZZ_SEED=7 FUZZ_CALLS=100`` hunts for new failures.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shlex
import signal
import sys

import pytest

from summary_files import read, write_two_runs
from test_cli_fuzz import run_cli

CALLS = int(os.environ.get("FUZZ_CALLS", 25))
SEED = os.environ.get("FUZZ_SEED", "63")
ALARM_S = 120
#: The command's own errors, and argparse's (which name the subcommand).
ERROR_LINE = re.compile(r"lightning-perf( [a-z-]+)?: error: ")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Real summaries, a mutated copy, a byte-identical copy, a failed run, and files no reader should take."""
    root = tmp_path_factory.mktemp("fuzz_pool")
    base, cand = write_two_runs(root)
    data = read(cand)
    files = {"base": base, "cand": cand}

    def put(name, text):
        path = str(root / name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        files[name] = path

    with open(base, encoding="utf-8") as fh:
        put("base_copy.json", fh.read())
    failed = json.loads(json.dumps(data))
    failed["status"] = "failed"
    put("failed.json", json.dumps(failed))
    no_count = json.loads(json.dumps(data))
    no_count.get("iteration_timer", {})["measured_iterations"] = None
    put("no_count.json", json.dumps(no_count))
    link = json.loads(json.dumps(data))
    link.setdefault("run", {})["name"] = "<script>alert(1)</script>" + "x" * 300
    link["path"] = "javascript:alert(1)"
    put("hostile_names.json", json.dumps(link))
    put("empty.json", "")
    put("not_json.json", "{\"schema_version\": ")
    put("list.json", "[1, 2, 3]")
    put("deep.json", "[" * 5000 + "]" * 5000)
    files["folder"] = str(root)
    files["missing"] = str(root / "no" / "such.json")
    files["devnull"] = os.devnull
    fifo = str(root / "fifo")
    os.mkfifo(fifo)
    files["fifo"] = fifo
    # matrix: a "LightningCLI script" that ends at once (no Trainer, so no summary), one that fails, and a config
    put("quick.py", "import sys\nsys.exit(0)\n")
    put("fails.py", "import sys\nsys.exit(3)\n")
    put("config.yaml", "trainer:\n  max_steps: 2\n")
    put("bad.yaml", "trainer: [unclosed\n")
    return files


HOSTILE = 0.1  # the chance of each token being a hostile one: most calls are valid but for one or two tokens


def pick(rng, valid, hostile):
    return rng.choice(hostile if hostile and rng.random() < HOSTILE else valid)


def _outputs(tmp):
    """Where a command may be asked to write badly: a folder, a path under a file, a device, a FIFO's place."""
    os.makedirs(tmp, exist_ok=True)
    plain = os.path.join(tmp, "plain_file")
    if not os.path.exists(plain):
        with open(plain, "w", encoding="utf-8") as fh:
            fh.write("x")
    return [tmp, os.path.join(plain, "below"), "/dev/full", ""]


BAD_NUMBERS = ["0", "-1", "nan", "inf", "-inf", "x", "", "10**9", "1e400"]
BAD_COUNTS = ["0", "-1", "x", "", "1.5", "1e3"]
THREADS = ["auto", "keep", "1"]
BAD_THREADS = ["0", "-1", "99", "x", ""]


def _race_argv(rng, files, tmp):
    names = ["base", "new", "b.2", "third"]
    bad_names = ["=", "", "a b", ".hidden", "x" * 80, "base_aa", "base"]
    programs = ["true", "false", "sh -c 'exit 3'", "sleep 0.01", "true # c", f"{shlex.quote(sys.executable)} -c pass"]
    bad_programs = ["/no/such/program", "'unclosed", "", files["devnull"], files["folder"], "sh -c 'kill -9 $$'"]
    argv = ["race"]
    for i in range(pick(rng, [2, 2, 3], [0, 1, 4])):
        name, program = pick(rng, names[i:i + 1], bad_names), pick(rng, programs, bad_programs)
        argv += ["--cmd", pick(rng, [f"{name}={program}"], [name, f"{name}=", f"={program}"])]
    outs = _outputs(tmp)
    argv += ["--out", pick(rng, [os.path.join(tmp, "race")], outs)]
    options = {
        "--repeats": (["1", "2"], BAD_COUNTS), "--budget": (["0.5", "30"], BAD_NUMBERS),
        "--timeout": (["5", "0.05"], BAD_NUMBERS), "--noise-floor": (["auto", "off", "new"], ["nope", "", "base"]),
        "--threads": (THREADS, BAD_THREADS), "--min-effect": (["0", "2", "50"], BAD_NUMBERS),
        "--callbacks": (["IterationTimer", "IterationTimer,SectionProfiler"], ["Nope", "", ","]),
        "--format": (["text", "json"], ["xml"]), "--report": ([os.path.join(tmp, "race.txt")], outs),
    }
    for flag in rng.sample(sorted(options), rng.randint(0, 4)):
        argv += [flag, pick(rng, *options[flag])]
    if "--repeats" not in argv:
        argv += ["--repeats", "2"]  # the default 5 rounds are cheap with `true`, but 2 keeps a call short
    return argv


def _matrix_argv(rng, files, tmp):
    argv = ["matrix", "--script", pick(rng, [files["quick.py"], files["fails.py"]],
                                       [files["missing"], files["folder"], files["devnull"], files["fifo"], ""])]
    if rng.random() < 0.7:
        argv += ["--config", pick(rng, [files["config.yaml"]], [files["bad.yaml"], files["missing"], files["folder"],
                                                                files["fifo"], files["devnull"], ""])]
    variants = ["baseline", "amp", "w2=--data.num_workers=2"]
    bad_variants = ["=x", "a=b=c", "", "x" * 80, "a b", "baseline_aa", "v=--trainer.max_steps", "base", "amp"]
    for i in range(pick(rng, [2, 3], [0, 1, 4])):
        argv += ["--variant", pick(rng, variants[i:i + 1] or variants, bad_variants)]
    outs = _outputs(tmp)
    argv += ["--out", pick(rng, [os.path.join(tmp, "matrix")], outs)]
    options = {
        "--repeats": (["1", "2"], BAD_COUNTS), "--budget": (["0.5", "30"], BAD_NUMBERS),
        "--timeout": (["5", "0.05"], BAD_NUMBERS),
        "--noise-floor": (["auto", "off", "amp"], ["nope", "", "baseline_aa"]),
        "--threads": (THREADS, BAD_THREADS), "--best-by": (["end-to-end", "steady"], ["fast"]),
        "--trial": (["channels_last", "tf32"], ["bogus", ""]), "--format": (["markdown", "csv"], ["json"]),
        "--report": ([os.path.join(tmp, "matrix.md")], outs), "--csv": ([os.path.join(tmp, "matrix.csv")], outs),
    }
    for flag in rng.sample(sorted(options), rng.randint(0, 4)):
        argv += [flag, pick(rng, *options[flag])]
    if "--repeats" not in argv:
        argv += ["--repeats", "1"]
    return argv


#: Runs of the base's setup and of the candidate's (a run given on both sides is refused: a hostile draw).
BASE_SIDE = ["base", "base_copy.json"]
CANDIDATE_SIDE = ["cand", "failed.json", "no_count.json", "hostile_names.json"]
GOOD_SUMMARIES = BASE_SIDE + CANDIDATE_SIDE
BAD_SUMMARIES = ["empty.json", "not_json.json", "list.json", "deep.json", "folder", "missing", "devnull", "fifo"]


def _summaries(rng, files, count, side=GOOD_SUMMARIES):
    return [files[pick(rng, side, BAD_SUMMARIES + [k for k in GOOD_SUMMARIES if k not in side])] for _ in range(count)]


def _compare_argv(rng, files, tmp):
    argv = ["compare", *_summaries(rng, files, 1, BASE_SIDE), *_summaries(rng, files, 1, CANDIDATE_SIDE)]
    for flag, side in (("--base-repeats", BASE_SIDE), ("--candidate-repeats", CANDIDATE_SIDE)):
        if rng.random() < 0.8:
            argv += [flag, *_summaries(rng, files, rng.randint(1, 3), side)]
    options = {"--fail-if-slower": (["5", "0", "50"], BAD_NUMBERS), "--min-effect": (["0", "2"], BAD_NUMBERS),
               "--format": (["text", "markdown", "json"], ["x"]), "--iterations": (["30000", "10"], BAD_COUNTS),
               "--html": ([os.path.join(tmp, "compare.html")], _outputs(tmp))}
    for flag in rng.sample(sorted(options), rng.randint(0, 3)):
        argv += [flag, pick(rng, *options[flag])]
    if rng.random() < 0.2:
        argv += ["--names", "a", pick(rng, ["b", "<b>"], ["a", ""])]
    return argv


def _report_argv(rng, files, tmp):
    runs = _summaries(rng, files, rng.randint(1, 4))
    argv = ["report", *runs, "--html", pick(rng, [os.path.join(tmp, "report.html")], _outputs(tmp))]
    if rng.random() < 0.3:
        count = pick(rng, [len(runs)], [len(runs) + 1, 0])
        argv += ["--names", *[pick(rng, ["a", "<i>x</i>", "javascript:x"], ["", "n" * 200]) for _ in range(count)]]
    if rng.random() < 0.2:
        argv += ["--notes", *["note <b>" for _ in runs]]
    options = {"--format": (["markdown", "csv"], ["html"]), "--change-vs": (["first", "previous"], ["last"]),
               "--column": (["quality.psnr", "run.name"], ["nope.key", ""])}
    for flag in rng.sample(sorted(options), rng.randint(0, 2)):
        argv += [flag, pick(rng, *options[flag])]
    return argv


DRAWS = {"race": _race_argv, "matrix": _matrix_argv, "compare": _compare_argv, "report": _report_argv}


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"no answer within {ALARM_S} s")


def check(argv, rc, out, err):
    """The promise of every command: 0, 1 or 2; no traceback; an exit 2 ends in one error line."""
    shown = " ".join(shlex.quote(a) for a in argv)[:600]
    assert rc in (0, 1, 2), (shown, rc, err[-2000:])
    assert "Traceback" not in out + err, (shown, (out + err)[-3000:])
    assert "internal error" not in err, (shown, err[-2000:])
    if rc == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and ERROR_LINE.match(lines[-1]), (shown, err[-2000:])
        if argv[0] in ("compare", "report"):
            assert len(lines) == 1, (shown, err)
    for word in ("nanx", "infx", "nan%", "inf%"):
        assert word not in out.lower(), (shown, out[-2000:])


@pytest.mark.parametrize("command", sorted(DRAWS))
def test_seeded_calls_answer_with_0_1_or_2_and_never_a_traceback_or_a_hang(command, pool, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command's default --out lands here, not in the checkout
    rng = random.Random(f"{command}-{SEED}")
    answers = collections.Counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(CALLS):
            argv = DRAWS[command](rng, pool, str(tmp_path / f"call{i}"))
            signal.alarm(ALARM_S)
            try:
                rc, out, err = run_cli(argv)
            finally:
                signal.alarm(0)
            check(argv, rc, out, err)
            answers[rc] += 1
        print(f"{command}: {CALLS} calls, exit codes {dict(sorted(answers.items()))}")
    finally:
        signal.signal(signal.SIGALRM, previous)
