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
# tests/conftest.py). `make test TEST_WORKERS=0` runs it in this process alone. --dist worksteal: a worker that runs
# out of tests takes half of another's queue. xdist's default (load) hands out contiguous chunks early, so the five seed
# scripts of tests/test_seeds.py, side by side and ~4 minutes of a worker on CI, fall to one worker while the other
# can sit idle at the end (simulated on the suite's durations: ~1.3 minutes lost on CI; worksteal: a few seconds).
# test-lowest keeps load: without the seeds no cluster of long tests ends its collection, and worksteal, which cannot
# take the last two tests queued on a worker, ended ~25 s later there in the same simulation.
TEST_WORKERS ?= auto
TEST_DIST := --dist worksteal
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) $(TEST_DIST)

# The tests that drive Lightning, against the lowest Lightning that pyproject.toml allows, installed beside the venv's
# newest in $(LOWEST_DIR) and put first on the path. Lightning 2.2 imports pkg_resources, which new setuptools no
# longer ship: an older one goes in with it. Keep LOWEST_LIGHTNING in step with pyproject's floor.
LOWEST_LIGHTNING := 2.2.0
# An allow-list: a file is here when what it checks is measured from Lightning's loop (the
# callbacks' fits, their hooks, accumulation and manual optimization, resume, LightningCLI configs, DDP, `run`'s hook
# on the Trainer, the version check). Left out: the files whose fits, if any, only make summaries for what they check
# (compare, report, diagnosis ceilings, verdict words, readers, the CLI's answers, statistics, clocks, the layout), the
# bench sweeps on torch alone, and the commands that run whole trainings in rounds of subprocesses (race, matrix,
# make demo, the seed scripts, benchmarks/): their fits are the ones the files below run on 2.2. A new test file that
# fits a model to check a measurement belongs here; one that checks words or statistics does not.
# Checked by logging every Trainer.__init__ and Trainer._run of the suite by test (a sitecustomize wrapping them in the
# test process and every subprocess): each file below runs fits (test_lightning_version.py checks the version itself);
# of test_bench.py, only the two matrix tests named here put the suite into a Trainer (LightningCLI, fill mode).
LOWEST_TESTS := tests/test_lightning_version.py tests/test_conformance.py tests/test_perf_suite.py \
	tests/test_nothing_lost.py tests/test_fail_closed_state.py tests/test_fail_closed_writes.py \
	tests/test_summary_typed.py tests/test_inline_guards.py \
	tests/test_iteration_timer.py tests/test_iteration_end_work.py tests/test_tail.py tests/test_tail_sections.py \
	tests/test_step_trace.py tests/test_section_profiler.py tests/test_manual_optimization_sections.py \
	tests/test_printer.py tests/test_transfer_section.py tests/test_data_loading.py tests/test_adversarial_workers.py \
	tests/test_vram_monitor.py tests/test_memory_snapshot.py tests/test_device_activity.py tests/test_energy.py \
	tests/test_contention.py tests/test_flops.py tests/test_diagnosis.py \
	tests/test_eval_no_grad_guard.py tests/test_eval_train_mode.py tests/test_eval_in_train_hooks.py \
	tests/test_issue60_check.py \
	tests/test_quality_gate.py tests/test_quality_gate_step.py \
	tests/test_ab_trial.py tests/test_adversarial_trial.py tests/test_trial_cli.py tests/test_user_trial_cli.py \
	tests/test_run_command.py tests/test_adversarial_writes.py \
	tests/test_bench.py::test_a_summary_the_matrix_cannot_copy_is_read_at_once_and_no_path_to_it_is_kept \
	tests/test_bench.py::test_matrix_fill_mode_adds_only_what_the_trainer_lacks
# Within those files: a matrix of trials (orchestration), the several-process numbering of `run` (Pool workers, a
# fork, a DDP fit under run: the numbering is lightning_perf's own file lock, no Lightning in it).
LOWEST_SKIP := tests/test_user_trial_cli.py::test_matrix_trial_passes_a_users_switch_spec_to_the_fits \
	tests/test_adversarial_writes.py::test_trainers_of_two_processes_under_one_run_get_a_file_each \
	tests/test_adversarial_writes.py::test_a_ddp_fit_under_run_is_one_trainer_numbered_by_rank_0
LOWEST_DIR := $(VENV)/lowest-lightning
test-lowest: $(STAMP)
	rm -rf $(LOWEST_DIR)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(LOWEST_DIR) \
		"lightning==$(LOWEST_LIGHTNING)" "setuptools<70"
	PYTHONPATH=$(LOWEST_DIR) LIGHTNING_PERF_EXPECT_LIGHTNING=$(LOWEST_LIGHTNING) $(PY) -m pytest -q -n $(TEST_WORKERS) \
		$(LOWEST_TESTS) $(addprefix --deselect ,$(LOWEST_SKIP))

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

# On a machine with a CUDA GPU: every CUDA figure against an independent measure (docs/gpu.md), then the price of
# the suite beside Lightning's own monitors on the same steps (paired A/B, host-bound and GPU-bound CUDA loops), the
# price of each host call on CUDA and the in-hook figures (~8 minutes in all on an H200).
# In an environment that already has the project: `make gpu-check STAMP= PY=python3`.
# Each step runs even when one before it failed; the recipe fails at the end, naming the steps that failed
# (runs/gpu_check/failed). The VRAM checks run first in a fresh process, then again after every other check:
# tests/gpu/agree.py holds their peaks to 1 MB of each other. Rows: runs/gpu_check/{vram_first,new,checks}.{md,json}.
VRAM_CHECKS := eval_spike or leak_check
GPU_NEW := tests/gpu/test_gpu_since.py tests/gpu/test_gpu_loops.py
GPU_ROWS := runs/gpu_check
gpu-check: $(STAMP)
	mkdir -p $(GPU_ROWS) && rm -f $(GPU_ROWS)/failed
	LIGHTNING_PERF_GPU_ROWS=$(GPU_ROWS)/vram_first.json $(PY) -m pytest -m gpu tests/gpu -k "$(VRAM_CHECKS)" -rA \
		-p no:cacheprovider || echo vram_first >> $(GPU_ROWS)/failed
	LIGHTNING_PERF_GPU_ROWS=$(GPU_ROWS)/new.json $(PY) -m pytest -m gpu $(GPU_NEW) -rA -p no:cacheprovider \
		|| echo new_checks >> $(GPU_ROWS)/failed
	$(PY) benchmarks/overhead.py --device cuda --paired --configs "Lightning monitors" PerfSuite \
		|| echo paired_overhead >> $(GPU_ROWS)/failed
	LIGHTNING_PERF_GPU_ROWS=$(GPU_ROWS)/checks.json $(PY) -m pytest -m gpu tests -rA -p no:cacheprovider \
		$(addprefix --ignore=,$(GPU_NEW)) || echo checks >> $(GPU_ROWS)/failed
	$(PY) tests/gpu/agree.py $(GPU_ROWS)/vram_first.json $(GPU_ROWS)/checks.json || echo agree >> $(GPU_ROWS)/failed
	$(PY) benchmarks/cuda_calls.py || echo cuda_calls >> $(GPU_ROWS)/failed
	$(PY) benchmarks/overhead.py --device cuda --hooks-only $(CALLBACKS) PerfSuite || echo hooks_only >> $(GPU_ROWS)/failed
	cat $(GPU_ROWS)/new.md $(GPU_ROWS)/checks.md 2>/dev/null || true
	@test ! -s $(GPU_ROWS)/failed || { echo "gpu-check: failed: $$(tr '\n' ' ' < $(GPU_ROWS)/failed)"; exit 1; }

clean:
	rm -rf $(VENV) runs .pytest_cache
