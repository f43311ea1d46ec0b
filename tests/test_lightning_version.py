"""Which Lightning the suite runs against: `make test` the newest pip resolves, `make test-lowest` the floor of
pyproject.toml. This test fails if the floor run silently imported another Lightning, or the floor moved without
the Makefile."""

import os
import re

import lightning
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _floor() -> Version:
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        return Version(re.search(r'"lightning>=([0-9.]+)"', fh.read()).group(1))


def test_the_lightning_under_test_is_the_one_asked_for():
    expected = os.environ.get("LIGHTNING_PERF_EXPECT_LIGHTNING")
    if expected:
        assert lightning.__version__ == expected, (lightning.__file__, lightning.__version__)
    assert Version(lightning.__version__) >= _floor()


def test_the_makefiles_lowest_lightning_is_pyprojects_floor():
    with open(os.path.join(ROOT, "Makefile")) as fh:
        lowest = re.search(r"^LOWEST_LIGHTNING := ([0-9.]+)$", fh.read(), re.M).group(1)
    assert Version(lowest) == _floor(), (lowest, str(_floor()))
