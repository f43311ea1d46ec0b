# The two commands of the README: `make demo` and `make test`. Each builds .venv first if needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO := runs/demo
CALLBACKS := IterationTimer SectionProfiler VRAMMonitor EvalNoGradGuard QualityGate

.PHONY: env demo test test-lowest bench gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

env: $(STAMP)

# Two runs (the second with 2 DataLoader workers, gated on the first's quality), compare's full text (also in
# compare.txt), report's table into report.md, then the answer in ten lines (examples/demo_answer.py). ~30 s on a
# 2-core machine. DEMO_ARGS go to both runs (the tests: `DEMO_ARGS="--max-steps 40 --val-every 20"`).
DEMO_ARGS ?=
LIGHTNING_PERF ?= $(VENV)/bin/lightning-perf
demo: $(STAMP)
	rm -rf $(DEMO)
	$(PY) examples/demo.py --out $(DEMO) --name baseline $(DEMO_ARGS)
	$(PY) examples/demo.py --out $(DEMO) --name workers2 --workers 2 --baseline $(DEMO)/baseline/perf_summary.json \
		$(DEMO_ARGS)
	$(LIGHTNING_PERF) compare $(DEMO)/baseline/perf_summary.json $(DEMO)/workers2/perf_summary.json \
		> $(DEMO)/compare.txt && cat $(DEMO)/compare.txt
	$(LIGHTNING_PERF) report $(DEMO)/baseline/perf_summary.json $(DEMO)/workers2/perf_summary.json > $(DEMO)/report.md
	@$(PY) examples/demo_answer.py --out $(DEMO) $(DEMO)/baseline/perf_summary.json $(DEMO)/workers2/perf_summary.json

# The suite in TEST_WORKERS processes (pytest-xdist; `auto`: one a core, each with torch on one thread: see
# tests/conftest.py). `make test TEST_WORKERS=0` runs it in this process alone.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS)

# The same suite (but the slow seed scripts, and the tests of benchmarks/overhead.py and own_steps.py: developer tools,
# ~1.5 minutes of subprocesses) against the lowest Lightning that pyproject.toml allows, installed beside
# the venv's newest in $(LOWEST_DIR) and put first on the path. Lightning 2.2 imports pkg_resources, which new
# setuptools no longer ship: an older one goes in with it. Keep LOWEST_LIGHTNING in step with pyproject's floor.
LOWEST_LIGHTNING := 2.2.0
LOWEST_DIR := $(VENV)/lowest-lightning
test-lowest: $(STAMP)
	rm -rf $(LOWEST_DIR)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(LOWEST_DIR) \
		"lightning==$(LOWEST_LIGHTNING)" "setuptools<70"
	PYTHONPATH=$(LOWEST_DIR) LIGHTNING_PERF_EXPECT_LIGHTNING=$(LOWEST_LIGHTNING) $(PY) -m pytest -q -n $(TEST_WORKERS) \
		--deselect tests/test_seeds.py --deselect tests/test_overhead_benchmark.py

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

# On a machine with a CUDA GPU: every CUDA figure against an independent measure (docs/gpu.md), then the price of
# each host call on CUDA and the suite's overhead: A/B, paired A/B and in-hook figures of the suite in one PerfSuite
# (~6 minutes in all on an H100; the whole `overhead.py --device cuda`, every configuration, takes over 8 more).
# In an environment that already has the project: `make gpu-check STAMP= PY=python3`.
# The VRAM checks run first in a fresh process, then again after every other check: tests/gpu/agree.py holds their
# peaks to 1 MB of each other.
VRAM_CHECKS := eval_spike or leak_check
gpu-check: $(STAMP)
	mkdir -p runs/gpu_check
	LIGHTNING_PERF_GPU_ROWS=runs/gpu_check/vram_first.json $(PY) -m pytest -m gpu tests/gpu -k "$(VRAM_CHECKS)" -rA \
		-p no:cacheprovider
	$(PY) -m pytest -m gpu tests -rA -p no:cacheprovider
	$(PY) tests/gpu/agree.py runs/gpu_check/vram_first.json runs/gpu_check/checks.json
	$(PY) benchmarks/cuda_calls.py
	$(PY) benchmarks/overhead.py --device cuda --ab-only --configs "1 no-op" PerfSuite
	$(PY) benchmarks/overhead.py --device cuda --paired --configs "1 no-op" PerfSuite
	$(PY) benchmarks/overhead.py --device cuda --hooks-only $(CALLBACKS) PerfSuite

clean:
	rm -rf $(VENV) runs .pytest_cache
