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

# The same suite (but the slow seed scripts, the tests of benchmarks/overhead.py and own_steps.py: developer tools,
# ~1.5 minutes of subprocesses, and LOWEST_SKIP below) against the lowest Lightning that pyproject.toml allows,
# installed beside the venv's newest in $(LOWEST_DIR) and put first on the path. Lightning 2.2 imports pkg_resources,
# which new setuptools no longer ship: an older one goes in with it. Keep LOWEST_LIGHTNING in step with pyproject's
# floor.
LOWEST_LIGHTNING := 2.2.0
# Also left out there: the commands that run whole trainings in rounds of subprocesses (matrix, race, make demo, the
# A/A noise floor on real fits, the rounds' order, their torch threads, a trial pooled over them, race and matrix
# interrupted or timed out, and the fuzz of race, matrix, compare's repeats and report --html): ~7 minutes of
# orchestration whose fits the in-process tests already run on 2.2. What of the matrix meets Lightning (its LightningCLI
# variants with the suite attached, a config's own callbacks) is still run there by
# test_a_summary_the_matrix_cannot_copy_is_read_at_once_and_no_path_to_it_is_kept, and `run --trial` by test_trial_cli.
LOWEST_SKIP := tests/test_race.py tests/test_noise_floor.py \
	tests/test_demo.py::test_make_demo_ends_on_the_answer_with_the_summaries_figures \
	tests/test_bench.py::test_matrix_on_the_demo_with_two_variants_and_a_crash \
	tests/test_bench.py::test_matrix_measures_with_the_configs_own_lightning_perf_callbacks \
	tests/test_bench.py::test_matrix_cli_runs_the_aa_copy_in_the_rounds_and_a_budget_stops_them \
	tests/test_bench.py::test_matrix_repeats_run_interleaved_and_each_variant_keeps_its_runs \
	tests/test_threads.py::test_matrix_and_race_run_torch_with_the_chosen_threads \
	tests/test_matrix_trial.py::test_matrix_trial_reports_each_variants_in_run_speedup_from_its_summaries \
	tests/test_adversarial_race_matrix.py tests/test_cli_fuzz_commands.py \
	tests/test_user_trial_cli.py::test_matrix_trial_passes_a_users_switch_spec_to_the_fits
# Also: the several-process numbering of `run` (Pool workers, a fork, a DDP fit under run: the numbering is
# lightning_perf's own file lock, no Lightning in it) and the straggler's 4-rank DDP fits (the rule that names it
# reads the gathered ranks, which tests/test_perf_suite.py's DDP fit gathers on 2.2 too; the rule's own tests stay).
LOWEST_SKIP += tests/test_adversarial_writes.py::test_trainers_of_two_processes_under_one_run_get_a_file_each \
	tests/test_adversarial_writes.py::test_a_ddp_fit_under_run_is_one_trainer_numbered_by_rank_0 \
	tests/test_stragglers.py::test_the_rank_that_waits_for_data_is_named_with_its_section \
	tests/test_stragglers.py::test_an_a_a_set_of_ranks_names_no_straggler \
	tests/test_stragglers.py::test_compare_and_report_show_the_straggler
# And the tests that import no Lightning at all, in the test process or in any subprocess they start (checked by running
# them with a sitecustomize whose import hook logs every lookup of lightning, pytorch_lightning, lightning_fabric,
# pkg_resources and setuptools, all that $(LOWEST_DIR) holds: none): `lightning-perf bench` sweeps, their rounds and
# frontier on torch alone, and the statistics, clocks and ledger of lightning_perf/measure. Lightning 2.2 cannot change
# what they prove (119 tests, ~45 s of a worker on CI). A test added to these files that fits a model belongs in
# another file.
LOWEST_SKIP += tests/test_bench_sweeps.py tests/test_bench_rounds.py tests/test_bench_frontier.py tests/test_stats.py \
	tests/test_trial_stats.py tests/test_speed_verdict.py tests/test_clock.py tests/test_section_ledger.py \
	tests/test_bench.py::test_sweep_writes_csv_plot_and_table_then_appends \
	tests/test_bench.py::test_out_of_memory_is_a_row_and_the_sweep_goes_on \
	tests/test_bench.py::test_another_error_is_recorded_and_the_exit_code_says_so \
	tests/test_bench.py::test_bad_input_is_one_line_and_exit_2 \
	tests/test_bench.py::test_a_csv_with_another_header_is_refused_untouched \
	tests/test_bench.py::test_sweep_as_a_python_function \
	tests/test_bench.py::test_analysis_from_csv_and_bench_compare \
	tests/test_bench.py::test_without_csv_the_rows_go_to_runs_bench_csv
# And what the comparing commands say (the A/A property tests of compare, report, race, matrix and bench: the
# words derived from one decided verdict, on summaries of fits the callbacks' own tests run on 2.2 too), the
# sequential rounds' statistics and their real races, and the package's import graph (ast only).
LOWEST_SKIP += tests/test_one_voice_compare.py tests/test_one_voice_bench.py tests/test_sequential_rounds.py \
	tests/test_layout.py
LOWEST_DIR := $(VENV)/lowest-lightning
test-lowest: $(STAMP)
	rm -rf $(LOWEST_DIR)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(LOWEST_DIR) \
		"lightning==$(LOWEST_LIGHTNING)" "setuptools<70"
	PYTHONPATH=$(LOWEST_DIR) LIGHTNING_PERF_EXPECT_LIGHTNING=$(LOWEST_LIGHTNING) $(PY) -m pytest -q -n $(TEST_WORKERS) \
		$(addprefix --deselect ,tests/test_seeds.py tests/test_overhead_benchmark.py $(LOWEST_SKIP))

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
	$(PY) benchmarks/overhead.py --device cuda --paired --configs "Lightning monitors (3)" PerfSuite \
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
