"""Fuzz of the readers: real summaries, mutated at random paths, through the real CLI.

Whatever a file holds, `compare`, `report` (with and without --plot) and the `--fail-if-slower` gate answer with
exit 0, 1 or 2; an exit 2 is exactly one line on stderr naming the file; nothing prints a traceback, and no
speedup is ever `nan` or `inf`. Most examples run `lightning_perf.cli.main` in-process (a subprocess per example
would take minutes); `test_cli_subprocess_on_mutants` runs a few through the installed entry point.
The draws are the same every run; ``FUZZ_RANDOM=1`` draws fresh ones to hunt (``FUZZ_EXAMPLES``, ``FUZZ_PLOT_EXAMPLES``
set how many).
"""

import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from summary_files import read, write_two_runs
from lightning_perf.cli import main

#: The suite draws the same examples every run (a red CI is a regression, not a new draw); ``FUZZ_RANDOM=1`` draws
#: fresh ones to hunt for new failures: ``FUZZ_RANDOM=1 FUZZ_EXAMPLES=5000 pytest tests/test_cli_fuzz.py``.
DERANDOMIZE = not os.environ.get("FUZZ_RANDOM")
DEEP = "__deeply_nested__"
HUGE_DIGITS = "__5000_digits__"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base, cand = write_two_runs(tmp_path_factory.mktemp("fuzz_runs"))
    return {"base": read(base), "cand": read(cand)}


def _paths(node, prefix=()):
    """Every path to a value in a decoded summary: object keys and list indexes, inner nodes included."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node[:3]):
            out += _paths(value, prefix + (i,))
    return out


NASTY = st.sampled_from([
    None, True, False, "yes", "", "fast", "$\\macro$", "\udc80", "a|b\nc", 0, -1, -0.5, 1e-320, 1e300, 1e308,
    10**30, 10**400, float("nan"), float("inf"), float("-inf"), [], [1, "x"], {}, {"mean": "x"}, DEEP, HUGE_DIGITS,
])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _at(node, path):
    for key in path:
        node = node[key]
    return node


def similar(value):
    """Values a valid file may hold where ``value`` is: extreme numbers, hostile strings, null."""
    if isinstance(value, bool):
        return st.sampled_from([True, False, None])
    if isinstance(value, int):
        return st.sampled_from([0, 1, 2**62, None]) | st.integers(0, 10**6)
    if isinstance(value, float):
        return (st.sampled_from([0.0, 1e-320, 1e-300, 1e300, 1.7e308, None])
                | st.floats(min_value=0, allow_nan=False, allow_infinity=False))
    if isinstance(value, str):
        return st.sampled_from(["", "$\\macro$", "\udc80", "a|b\nc", "x" * 500, None]) | st.text(max_size=10)
    return st.sampled_from([None])


@st.composite
def mutations(draw, real):
    """1-3 edits of the candidate (and maybe of the base): (file, path, value), value DELETE to remove the key.
    Drawn as edits, not as whole files, so a failing example prints what was changed."""
    edits = []
    for name in ("base", "cand"):
        if name == "base" and not draw(st.booleans()):
            continue
        paths = _paths(real[name])
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(paths))
            kind = draw(st.integers(0, 9))
            if kind == 0:
                value = DELETE
            elif kind <= 5:  # a value of the same kind: the file stays valid, the figures get extreme
                value = draw(similar(_at(real[name], path)))
            else:
                value = draw(NASTY | JSON_VALUES)
            edits.append((name, path, value))
    return edits


DELETE = "__delete__"


def apply(real, edits):
    """The two files' texts after ``edits``; an edit whose path a previous edit removed is skipped."""
    data = {name: json.loads(json.dumps(real[name])) for name in ("base", "cand")}
    for name, path, value in edits:
        parent = data[name]
        try:
            for key in path[:-1]:
                parent = parent[key]
            if value == DELETE:
                if isinstance(parent, dict):
                    parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    texts = []
    for name in ("base", "cand"):
        text = json.dumps(data[name], allow_nan=True)
        text = text.replace(json.dumps(DEEP), "[" * 5000 + "]" * 5000)
        texts.append(text.replace(json.dumps(HUGE_DIGITS), "9" * 5000))
    return texts


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exit_:  # argparse
            rc = exit_.code
    return rc, out.getvalue(), err.getvalue()


def check_answer(rc, out, err, files):
    assert rc in (0, 1, 2), (rc, err)
    assert "Traceback" not in out + err
    assert "internal error" not in err, err  # the CLI's last line of defence was reached: a reader's bug
    if rc == 2:
        assert err.count("\n") == 1 and err.startswith("lightning-perf: error:"), err
        assert any(f in err for f in files), err
    for word in ("nanx", "infx", "nan%", "inf%", " nan ", " inf "):
        assert word not in out.lower(), out


COMMANDS = [
    ["compare", "{base}", "{cand}"],
    ["compare", "{base}", "{cand}", "--fail-if-slower", "5"],
    ["compare", "{base}", "{cand}", "--format", "markdown"],
    ["compare", "{base}", "{cand}", "--format", "json"],
    ["report", "{base}", "{cand}"],
    ["report", "{base}", "{cand}", "--format", "csv"],
]


def _write(tmp_path, base_text, cand_text):
    files = {"base": str(tmp_path / "base" / "mutant.json"), "cand": str(tmp_path / "cand" / "mutant.json")}
    for name, text in (("base", base_text), ("cand", cand_text)):
        os.makedirs(os.path.dirname(files[name]), exist_ok=True)
        with open(files[name], "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write(text)
    return files


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("mutants")


def test_readers_answer_every_mutant_with_0_1_or_2_and_one_line(real, scratch):
    @settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 300)), deadline=None, database=None,
              derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data):
        files = _write(scratch, *apply(real, data.draw(mutations(real))))
        command = data.draw(st.sampled_from(COMMANDS))
        argv = [a.format(**files) for a in command]
        rc, out, err = run_cli(argv)
        event(f"{argv[0]} exit {rc}")
        check_answer(rc, out, err, files.values())
        if "--fail-if-slower" in argv and rc == 0:
            # a green gate means a finite speedup was computed from figures that passed the model
            result = json.loads(run_cli(argv[:3] + ["--format", "json"])[1])
            assert result["speedup"] is not None and math.isfinite(result["speedup"])

    check()


def test_report_plot_answers_every_mutant(real, scratch):
    pytest.importorskip("matplotlib")

    @settings(max_examples=int(os.environ.get("FUZZ_PLOT_EXAMPLES", 25)), deadline=None, database=None,
              derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data):
        files = _write(scratch, *apply(real, data.draw(mutations(real))))
        png = str(scratch / "report.png")
        rc, out, err = run_cli(["report", files["base"], files["cand"], "--plot", png])
        check_answer(rc, out, err, list(files.values()) + [png])

    check()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_cli_subprocess_on_mutants(real, tmp_path, seed):
    """The installed command, under PYTHONIOENCODING=utf-8, on a few mutants drawn with a fixed seed."""
    import random

    rng = random.Random(seed)
    data = json.loads(json.dumps(real["cand"]))
    nasty = ["yes", "\udc80 $\\alpha$", -1, 10**400, [1], {"x": 1}, None, "a|b\nc"]
    for _ in range(3):
        path = rng.choice(_paths(data))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = rng.choice(nasty)
    files = _write(tmp_path, json.dumps(real["base"]), json.dumps(data))
    for command in COMMANDS[1:2] + COMMANDS[4:5]:
        argv = [a.format(**files) for a in command]
        proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", *argv], capture_output=True,
                              text=True, errors="replace", timeout=120, env=dict(os.environ, PYTHONIOENCODING="utf-8"))
        check_answer(proc.returncode, proc.stdout, proc.stderr, files.values())
