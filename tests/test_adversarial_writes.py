"""Writes an adversary can break (issue 63): summaries of several processes under one ``run``, a SIGTERM while the
suite writes at the end of a fit, a ``--baseline`` that is not a regular file."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, cwd=None, timeout=240):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", "run", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


# -- 4. a --baseline that is not a regular file ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_run_refuses_a_baseline_that_is_not_a_regular_file_at_once(tmp_path, kind):
    if kind == "fifo":
        path = str(tmp_path / "baseline.json")
        os.mkfifo(path)
        what = "a named pipe"
    else:
        path, what = kind, "a character device"
    marker = tmp_path / "ran"
    proc = run_cli("--baseline", path, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()",
                   timeout=60)  # the hang guard: read whole, /dev/zero never ends and a named pipe blocks forever
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"lightning-perf: error: --baseline {path!r}: "), proc.stderr
    assert f"is {what}, not a regular file" in lines[0]
    assert not marker.exists()  # refused before the command ran
