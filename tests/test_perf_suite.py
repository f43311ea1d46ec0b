"""PerfSuite: the suite behind one Lightning callback, with the same figures, files and checkpoint state."""

import copy
import glob
import pickle
import pytest
import yaml
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import ImageModel, TinyModel, find_summary, fit, trainer_kwargs
from lightning_perf import (
    EvalNoGradGuard,
    IterationTimer,
    PerfSuite,
    QualityGate,
    SectionProfiler,
    VRAMMonitor,
)
from lightning_perf import PerfCheckFailed


class CountCalls(Callback):
    """Counts how often Lightning calls on_train_batch_end on each callback of the trainer."""

    def __init__(self):
        self.calls = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.calls += 1


def children():
    return [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
            VRAMMonitor(nvml_interval_s=0.01), EvalNoGradGuard()]


def test_the_suite_gives_the_same_summary_as_separate_callbacks(tmp_path):
    fit(tmp_path / "separate", children(), max_epochs=2)
    fit(tmp_path / "suite", [PerfSuite(children())], max_epochs=2)
    a, b = find_summary(tmp_path / "separate"), find_summary(tmp_path / "suite")
    for section in ("iteration_timer", "section_profiler", "vram", "eval_no_grad_guard"):
        assert section in b and "measurement_failures" not in b[section], section
    assert b["status"] == "completed"
    for key in ("iterations", "measured_iterations", "batches", "samples", "validation_runs"):
        assert a["iteration_timer"][key] == b["iteration_timer"][key], key
    assert a["section_profiler"]["iterations"] == b["section_profiler"]["iterations"]
    assert set(a["section_profiler"]["sections"]) == set(b["section_profiler"]["sections"])
    assert set(a["vram"]["phases"]) == set(b["vram"]["phases"])


def test_one_lightning_callback_and_hooks_only_where_defined(tmp_path):
    suite = PerfSuite(children())
    trainer = fit(tmp_path, [suite], max_epochs=1)
    ours = [cb for cb in trainer.callbacks if type(cb).__module__.startswith("lightning_perf")]
    assert ours == [suite]
    assert "on_train_batch_end" in suite._by_hook and "on_predict_batch_end" not in suite._by_hook
    assert len(suite._by_hook["on_before_backward"]) == 1  # only SectionProfiler times the backward


def test_every_hook_is_written_in_the_suites_class_and_forwards_to_the_callbacks_that_define_it(tmp_path):
    """Lightning finds a hook by ``getattr`` on the suite: each hook Lightning calls with (trainer, pl_module, ...) is
    a method written in the suite's class (none put on the instance), which forwards to the callbacks that define it,
    a subclass's own step hook too; a copy's forward to the copy's callbacks. In a fit the backward and the optimizer
    step are timed through them."""
    from lightning.pytorch import Callback

    suite = PerfSuite(children())
    sp = suite.callbacks[1]
    hooks = [name for name in dir(Callback) if (name.startswith("on_") or name in ("setup", "teardown"))
             and callable(getattr(Callback, name)) and name != "on_load_checkpoint"]
    assert hooks and all(name in vars(PerfSuite) for name in hooks)
    assert not set(hooks) & set(vars(suite))
    assert [cb for _, cb in suite._by_hook["on_before_backward"]] == [sp]
    for c in (copy.deepcopy(suite), pickle.loads(pickle.dumps(suite))):
        assert [cb for _, cb in c._by_hook["on_before_backward"]] == [c.callbacks[1]] and c.callbacks[1] is not sp

    class OwnBackward(SectionProfiler):
        def on_before_backward(self, trainer, pl_module, loss):
            self.own_backward = True
            super().on_before_backward(trainer, pl_module, loss)

    own = OwnBackward(print_reports=False)
    fit(tmp_path / "own", [PerfSuite([own])], max_epochs=1)
    assert own.own_backward
    fit(tmp_path / "suite", [suite], max_epochs=1)
    sections = find_summary(tmp_path / "suite")["section_profiler"]["sections"]
    assert (sections["backward"]["count"] == sections["forward"]["count"] == sections["optimizer_step"]["count"]
            == 7)  # 8 steps, 1 of warm-up


def test_checkpoint_state_goes_through_the_suite_and_resume_covers_the_run(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path / "a", [PerfSuite(children()), ckpt], max_epochs=1)
    import torch

    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"][PerfSuite(children()).state_key]
    assert set(state) == {"IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard"}
    trainer = Trainer(callbacks=[PerfSuite(children())], **trainer_kwargs(tmp_path / "b", max_epochs=2))
    trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    s = find_summary(tmp_path / "b")
    assert s["iteration_timer"]["iterations"] == 16 and s["iteration_timer"]["resumed_at_iteration"] == 8


def test_a_failing_check_fails_the_fit_after_every_callback_ran(tmp_path):
    gate = QualityGate(metrics=["psnr"], baseline={"psnr": 99.0}, action="fail")
    with pytest.raises(PerfCheckFailed, match="checks failed"):
        fit(tmp_path, [PerfSuite([gate, IterationTimer(warmup_steps=1)])], model=ImageModel(), max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "failed" and s["iteration_timer"]["iterations"] == 4


def test_from_lightning_cli_yaml_with_nested_callbacks(tmp_path):
    from lightning.pytorch.cli import LightningCLI

    config = {"trainer": {
        "default_root_dir": str(tmp_path), "max_epochs": 1, "accelerator": "cpu", "devices": 1,
        "enable_progress_bar": False,
        "callbacks": [{"class_path": "lightning_perf.PerfSuite", "init_args": {"callbacks": [
            {"class_path": "lightning_perf.IterationTimer", "init_args": {"warmup_steps": 1}},
            {"class_path": "lightning_perf.VRAMMonitor", "init_args": {"nvml_interval_s": 0.01}},
        ]}}],
    }}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(TinyModel, args=["fit", "--config", str(path)], save_config_kwargs={"overwrite": True})
    suite = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PerfSuite))
    assert [type(cb).__name__ for cb in suite.callbacks] == ["IterationTimer", "VRAMMonitor"]
    s = find_summary(tmp_path)
    assert s["iteration_timer"]["warmup_steps"] == 1 and "vram" in s


def test_default_suite_and_bad_arguments():
    assert [type(cb).__name__ for cb in PerfSuite().callbacks] == [
        "IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard"]
    with pytest.raises(ValueError, match=r"PerfSuite\(callbacks=.*Only lightning_perf callbacks.*CountCalls"):
        PerfSuite([CountCalls()])
    with pytest.raises(ValueError, match="share the state key IterationTimer"):
        PerfSuite([IterationTimer(), IterationTimer()])
    two = PerfSuite([IterationTimer(summary_path="a.json"), IterationTimer(summary_path="b.json")])
    assert len({cb.state_key for cb in two.callbacks}) == 2


def test_a_running_suite_can_be_copied(tmp_path):
    suite = PerfSuite(children())
    copies = []

    class Copier(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 2:
                copies.append(copy.deepcopy(suite))
                copies.append(pickle.loads(pickle.dumps(suite)))

    fit(tmp_path, [suite, Copier()], max_epochs=1)
    for c in copies:
        fn, cb = c._by_hook["on_train_batch_end"][0]
        assert fn.__self__ is cb is c.callbacks[0]


def test_a_failing_measurement_inside_the_suite_is_recorded_on_its_callback_and_training_goes_on(tmp_path,
                                                                                                  monkeypatch):
    """The suite calls the callbacks' hooks without their own guard and guards them itself, the same way."""
    def broken(self, trainer):
        raise RuntimeError("section bookkeeping broke")

    monkeypatch.setattr(SectionProfiler, "_drain_scalars", broken)  # called from its batch end only
    with pytest.warns(UserWarning, match="SectionProfiler: measurement failed in `on_train_batch_end`"):
        trainer = fit(tmp_path, [PerfSuite([IterationTimer(), SectionProfiler(print_reports=False)])],
                      max_epochs=1)
    assert trainer.global_step == 8
    s = find_summary(tmp_path)
    assert "section bookkeeping broke" in s["section_profiler"]["measurement_failures"]["on_train_batch_end"]
    assert "measurement_failures" not in s["iteration_timer"] and s["iteration_timer"]["measured_iterations"] > 0


def test_window_scalars_reach_the_logger_a_few_per_batch_end_each_at_its_own_step(tmp_path):
    """IterationTimer, SectionProfiler and VRAMMonitor each report a window at batches 4 and 8 (~20 scalars). The
    window scalars are deferred: during training no logger call carries more than PER_BATCH_END of them (a burst
    would fill TensorBoard's queue of 10 and the training thread would wait for its writer); each arrives with the
    step it was measured at, a few batch ends later, and every (key, step) reaches the logger once, the same pairs
    inside a suite and apart, the last window's before the run ends."""
    from lightning.pytorch.loggers import CSVLogger

    from lightning_perf.callbacks.core.scalars import PER_BATCH_END, WAITING

    def run(together, root):
        calls = []
        seen = {}

        class Counting(CSVLogger):
            def log_metrics(self, metrics, step=None):
                calls.append((seen["trainer"].global_step, step, tuple(sorted(metrics))))
                super().log_metrics(metrics, step)

        class Remember(Callback):
            def setup(self, trainer, pl_module, stage):
                seen["trainer"] = trainer

        callbacks = [IterationTimer(warmup_steps=1),
                     SectionProfiler(warmup_steps=1, report_every_n_steps=4, print_reports=False), VRAMMonitor()]
        fit(root, [Remember(), *([PerfSuite(callbacks)] if together else callbacks)], max_epochs=2,
            log_every_n_steps=4, logger=Counting(root))
        ours = [(now, step, [k for k in keys if k.startswith(("perf/", "time", "vram/"))]) for now, step, keys in calls]
        return [c for c in ours if c[2]]

    apart, together = run(False, tmp_path / "apart"), run(True, tmp_path / "together")
    assert WAITING.count == 0
    window = {"perf/it_per_s", "perf/ms_per_iter", "time/forward_ms", "time_share/backward_pct",
              "vram/host_rss_peak_mb"}
    for calls in (apart, together):
        pairs = [(k, step) for _, step, keys in calls for k in keys]
        assert len(pairs) == len(set(pairs))  # each key once per step
        for key in window:
            assert {step for k, step in pairs if k == key} == {4, 8, 12, 16}, key
        during = [(now, step, keys) for now, step, keys in calls if now < 16 and set(keys) & window]
        assert during and all(len(keys) <= PER_BATCH_END for _, _, keys in during)
        assert any(now > step for now, step, _ in during)  # deferred: logged after the step it belongs to
    assert sorted((k, step) for _, step, keys in apart for k in keys) == \
        sorted((k, step) for _, step, keys in together for k in keys)


def test_a_larger_tensorboard_queue_loses_no_scalar(tmp_path):
    """docs/perf_suite.md advises TensorBoardLogger(max_queue=1000) to make each logged scalar cheaper: the event
    files of a fit hold the same tags at the same steps as with TensorBoard's default queue of 10."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from helpers import read_scalars

    def run(root, **queue):
        callbacks = [IterationTimer(), SectionProfiler(report_every_n_steps=2, print_reports=False), VRAMMonitor()]
        fit(root, [PerfSuite(callbacks)], log_every_n_steps=2, logger=TensorBoardLogger(str(root), **queue))
        return {tag: sorted(step for step, _ in points) for tag, points in read_scalars(root).items()}

    default, large = run(tmp_path / "default"), run(tmp_path / "large", max_queue=1000)
    # host/ CPU figures need 0.25 s between readings, so which windows have one depends on the machine's speed
    ours = [tag for tag in default if tag.startswith(("perf/", "time/", "time_share/", "vram/"))]
    assert len(ours) >= 15 and sum(len(default[tag]) for tag in ours) > 100
    assert {tag: large.get(tag) for tag in ours} == {tag: default[tag] for tag in ours}
    assert {tag for tag in large if tag.startswith(("perf/", "time/", "time_share/", "vram/"))} == set(ours)


class CountGathers(Callback):
    """Counts the strategy's all_gather calls on each rank (in the spawned processes) and writes them to a file."""

    def __init__(self, folder):
        self.folder = str(folder)

    def setup(self, trainer, pl_module, stage):
        self.calls = 0
        original = trainer.strategy.all_gather

        def counting(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        trainer.strategy.all_gather = counting

    def teardown(self, trainer, pl_module, stage):
        del trainer.strategy.all_gather
        with open(f"{self.folder}/gathers_{trainer.global_rank}.txt", "w") as fh:
            fh.write(str(self.calls))


@pytest.mark.slow
def test_under_ddp_the_suite_gathers_once_for_all_its_callbacks(tmp_path):
    """Separate, IterationTimer, SectionProfiler and VRAMMonitor each make one all_gather at train end; in a PerfSuite
    they make one together, and each still gets its per-rank figures."""

    def run(root, together):
        root.mkdir()
        callbacks = [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
                     VRAMMonitor()]
        fit(root, [CountGathers(root), PerfSuite(callbacks) if together else callbacks[0], *([] if together else
            callbacks[1:])], strategy="ddp_spawn", devices=2, max_epochs=1)
        counts = [int((root / f"gathers_{rank}.txt").read_text()) for rank in (0, 1)]
        return counts, find_summary(root)

    (apart, apart_summary), (together, summary) = run(tmp_path / "apart", False), run(tmp_path / "together", True)
    assert apart == [3, 3] and together == [1, 1]
    for section, key in (("iteration_timer", "median_ms_per_iter"), ("section_profiler", "forward"),
                         ("vram", "train_peak_mb")):
        for s in (apart_summary, summary):
            spread = s[section]["ranks"][key]
            assert len(spread["per_rank"]) == 2 and all(v is not None for v in spread["per_rank"]), (section, spread)
            assert spread["min"] <= spread["median"] <= spread["max"]
        assert "measurement_failures" not in summary[section]


def test_one_gather_gives_each_callback_its_own_columns_and_keeps_a_failure_to_its_owner():
    """close_gather_batch on a simulated two-rank strategy: one all_gather of the concatenated values; a `then` that
    fails is returned with its owner, the others still get their rows."""
    from types import SimpleNamespace

    import torch

    from lightning_perf.callbacks.core.rank_gather import close_gather_batch, gather_floats_then, open_gather_batch

    gathered = []

    def all_gather(tensor):  # rank 1 reports each value plus 100
        gathered.append(tensor.tolist())
        return torch.stack([tensor, tensor + 100])

    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu"),
                                                                     all_gather=all_gather))
    got = {}

    def broken(rows):
        raise RuntimeError("spread failed")

    open_gather_batch(trainer)
    gather_floats_then(trainer, [1.0, None], broken, owner="first")
    gather_floats_then(trainer, [3.0], lambda rows: got.setdefault("second", rows), owner="second")
    assert gathered == [] and got == {}  # nothing gathered before the batch closes
    failures = close_gather_batch(trainer)
    assert len(gathered) == 1
    assert got["second"] == [[3.0], [103.0]]
    assert [(owner, str(err)) for owner, err in failures] == [("first", "spread failed")]
    gather_floats_then(trainer, [5.0], lambda rows: got.setdefault("after", rows))  # closed: gathers at once
    assert got["after"] == [[5.0], [105.0]] and len(gathered) == 2


def test_the_suite_key_is_built_once_and_survives_copies():
    """Lightning formats the key into a profiler action name on every hook call: it is built at construction (and
    after a copy, for the copies), and equals the key built from the callbacks' own keys."""
    suite = PerfSuite(children())
    expected = "PerfSuite{'callbacks': ['IterationTimer', 'SectionProfiler', 'VRAMMonitor', 'EvalNoGradGuard']}"
    assert suite.state_key == suite.__dict__["state_key"] == expected
    for twin in (copy.deepcopy(suite), pickle.loads(pickle.dumps(suite))):
        assert twin.state_key == expected and all(cb._in_suite for cb in twin.callbacks)


def test_the_keys_follow_a_summary_path_set_after_construction(tmp_path):
    """The keys are held on the instances (Lightning reads them at every hook call), so one built before a
    ``summary_path`` was set must not outlive it: a callback's key follows its path at once, a suite's from its
    ``setup`` on, which is where the checkpoint's entries are named from."""
    import torch

    timer = IterationTimer(warmup_steps=1)
    assert timer.state_key == "IterationTimer" and timer.__dict__["state_key"] == "IterationTimer"
    path = str(tmp_path / "run" / "perf_summary.json")
    timer.summary_path = path
    assert timer.state_key == timer._generate_state_key(summary_path=path) != "IterationTimer"
    timer.summary_path = None
    assert timer.state_key == "IterationTimer"

    members = children()
    suite = PerfSuite(members)
    before = suite.state_key
    members[0].summary_path = path
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path / "fit", [suite, ckpt], max_epochs=1)
    expected = suite._generate_state_key(callbacks=[cb.state_key for cb in members])
    assert suite.state_key == expected != before
    states = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"]
    assert before not in states and set(states[expected]) == {cb.state_key for cb in members}


def test_one_tensorboard_event_per_step_holds_the_same_points_as_one_per_scalar(tmp_path):
    """To Lightning's TensorBoardLogger the scalars of a step go as one event (one protobuf and two CRCs instead of
    one per scalar). In one fit with two loggers, Lightning's own and a subclass that keeps log_metrics (so gets one
    event per scalar), TensorBoard's own EventAccumulator reads back the same tags, steps and values from both."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from helpers import read_scalars
    from lightning_perf.callbacks.core import scalars as _scalars

    class OneByOne(TensorBoardLogger):
        def log_metrics(self, metrics, step=None):
            super().log_metrics(metrics, step)

    batched, one_by_one = TensorBoardLogger(str(tmp_path / "batched")), OneByOne(str(tmp_path / "one_by_one"))
    callbacks = [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, report_every_n_steps=2,
                                                                 print_reports=False), VRAMMonitor(activity=False)]
    paths = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            paths.append((_scalars._event_writer(batched) is not None, _scalars._event_writer(one_by_one) is None))

    fit(tmp_path, [PerfSuite(callbacks), Probe()], log_every_n_steps=2, logger=[batched, one_by_one])
    assert paths and all(a and b for a, b in paths)  # one event a step for Lightning's own, log_metrics for the other

    def ours(root):
        return {tag: sorted(points) for tag, points in read_scalars(root).items()
                if tag.startswith(("perf/", "time/", "time_share/", "vram/"))}

    a, b = ours(tmp_path / "batched"), ours(tmp_path / "one_by_one")
    assert len(a) >= 15 and sum(len(points) for points in a.values()) > 100
    assert a == b


@pytest.mark.parametrize("in_suite", [True, False])
def test_the_windows_of_one_log_step_reach_tensorboard_as_one_event(tmp_path, in_suite):
    """IterationTimer and VRAMMonitor log a window at its step's batch end; SectionProfiler logs the same step's
    window when that iteration closes, at the next batch's start. Held one batch, they go as one event: one wake-up
    of TensorBoard's writer per log step, where there were two."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    callbacks = [IterationTimer(warmup_steps=1, log_every_n_steps=10),
                 SectionProfiler(warmup_steps=1, report_every_n_steps=10, print_reports=False),
                 VRAMMonitor(activity=False, log_every_n_steps=10)]
    fit(tmp_path, [PerfSuite(callbacks)] if in_suite else callbacks, max_steps=40, max_epochs=None,
        limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False)
    events = {}
    for path in glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True):
        for event in EventFileLoader(path).Load():
            tags = {v.tag for v in event.summary.value}
            if any(t.startswith(("perf/", "time/", "vram/")) for t in tags):
                events.setdefault(event.step, []).append(tags)
    for step in (10, 20, 30):
        assert len(events[step]) == 1, (step, events[step])
        tags = events[step][0]
        assert {"perf/it_per_s", "time/iteration_ms", "time/forward_ms"} <= tags
        assert any(t.startswith("vram/") for t in tags)


def test_a_failure_of_the_suites_own_work_is_recorded_or_warned_never_raised():
    """The suite's logging and gathering record a failure on its first callback; an empty suite (allowed:
    ``PerfSuite([])``) has none to record it on and warns once instead of raising into training."""
    timer = IterationTimer()
    PerfSuite([timer])._record_failure(None, "on_train_batch_end (logging)", OSError("disk full"))
    assert timer._failures == {"on_train_batch_end (logging)": "OSError: disk full"}
    empty = PerfSuite([])
    with pytest.warns(UserWarning, match=r"PerfSuite on_train_batch_end \(logging\) failed: OSError: disk full"):
        empty._record_failure(None, "on_train_batch_end (logging)", OSError("disk full"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        empty._record_failure(None, "on_train_end (gather)", OSError("again"))  # once: no second warning
