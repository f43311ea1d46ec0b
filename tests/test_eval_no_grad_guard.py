import pytest
import torch
from lightning.pytorch import Callback, Trainer
from torch import nn

from helpers import TinyModel, find_summary, fit, read_scalars, trainer_kwargs
from lightning_perf import EvalNoGradGuard, allow_grad_in_eval
from lightning_perf.measure.memory.readers import RssReader


def live_rss_mb():
    """RSS after handing glibc's free heap back to the OS, so that it tracks live memory within one process."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return RssReader()()


class EvalsInTrainHook(TinyModel):
    """Seed 001's metric loop: renders 12 "test images" from a training-time hook and keeps them for the metrics."""

    def __init__(self, allow_ctx=False, no_grad=False):
        super().__init__()
        self.renderer = nn.Sequential(nn.Linear(16, 8192), nn.ReLU(), nn.Linear(8192, 16))
        self.allow_ctx, self.no_grad = allow_ctx, no_grad
        self.rss_during_eval = []
        self.rendered_sums = []

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx != 2:
            return
        self.eval()
        before = live_rss_mb()
        gen = torch.Generator().manual_seed(0)
        ctx = allow_grad_in_eval() if self.allow_ctx else (torch.no_grad() if self.no_grad else _null())
        with ctx:
            renders = [self.renderer(torch.randn(512, 16, generator=gen)) for _ in range(12)]
        self.rss_during_eval.append(live_rss_mb() - before)
        self.rendered_sums.append(float(sum(r.detach().sum() for r in renders)))
        del renders
        self.train()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_eval_from_on_train_batch_end_is_reported_with_site_and_bytes(tmp_path):
    with pytest.warns(UserWarning, match=r"EvalsInTrainHook.on_train_batch_end ran Sequential.forward in eval mode"):
        fit(tmp_path, [EvalNoGradGuard()], model=EvalsInTrainHook(), max_epochs=1)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    assert g["clean"] is False and g["mode"] == "warn"
    (finding,) = g["findings"]
    assert finding["site"] == "EvalsInTrainHook.on_train_batch_end"
    assert finding["hook"] == "on_train_batch_end" and finding["module"] == "Sequential"
    assert finding["count"] == 12 and finding["fixed"] is False
    # each forward saves its input (512x16) and the 512x8192 ReLU output: >= 16 MB each
    assert finding["saved_for_backward_mb"] >= 12 * 16
    assert g["saved_for_backward_mb"] == finding["saved_for_backward_mb"]
    scalars = read_scalars(tmp_path)
    assert scalars["guard/grad_enabled_eval_forwards"][-1][1] == 12


def test_fix_mode_saves_nothing_lowers_memory_and_keeps_results(tmp_path):
    warned = EvalsInTrainHook()
    fit(tmp_path / "warn", [EvalNoGradGuard(mode="warn")], model=warned, max_epochs=1)
    fixed = EvalsInTrainHook()
    fixed.load_state_dict(warned.state_dict())
    with pytest.warns(UserWarning, match="mode='fix' ran it under torch.no_grad"):
        fit(tmp_path / "fix", [EvalNoGradGuard(mode="fix")], model=fixed, max_epochs=1)
    g = find_summary(tmp_path / "fix")["eval_no_grad_guard"]
    (finding,) = g["findings"]
    assert finding["fixed"] is True and finding["saved_for_backward_mb"] == 0 and finding["count"] == 12
    # the graphs kept ~200 MB of activations alive in warn mode; with no_grad only the renders remain
    assert warned.rss_during_eval[0] > 150 and fixed.rss_during_eval[0] < 50, (warned.rss_during_eval,
                                                                             fixed.rss_during_eval)


def test_warn_mode_does_not_change_results(tmp_path):
    torch.manual_seed(0)
    guarded_model = EvalsInTrainHook()
    plain_model = EvalsInTrainHook()
    plain_model.load_state_dict(guarded_model.state_dict())
    torch.manual_seed(1)
    fit(tmp_path / "a", [EvalNoGradGuard()], model=guarded_model, max_epochs=1)
    torch.manual_seed(1)
    fit(tmp_path / "b", [], model=plain_model, max_epochs=1)
    assert guarded_model.rendered_sums == plain_model.rendered_sums


class KeepsLosses(TinyModel):
    def __init__(self):
        super().__init__()
        self.outputs = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.outputs.append(loss)  # keeps each step's graph alive until epoch end
        return loss

    def on_train_epoch_end(self):
        self.outputs.clear()


def test_a_list_of_losses_is_reported_by_attribute_name(tmp_path):
    with pytest.warns(UserWarning, match=r"`KeepsLosses.outputs` holds 8 tensors with autograd graphs at\s+on_validation_epoch_end"):
        fit(tmp_path, [EvalNoGradGuard()], model=KeepsLosses(), max_epochs=1)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    (retained,) = g["retained_graphs"]
    assert retained["attribute"] == "outputs" and retained["max_count"] == 8 and retained["seen_at"] == "on_validation_epoch_end"
    assert retained["max_mb_kept"] > 0


def test_clean_module_and_allowed_code_give_no_finding(tmp_path, recwarn):
    fit(tmp_path / "clean", [EvalNoGradGuard()], model=EvalsInTrainHook(no_grad=True), max_epochs=1)
    fit(tmp_path / "allow_hook", [EvalNoGradGuard(allow=["on_train_batch_end"])], model=EvalsInTrainHook(),
        max_epochs=1)
    fit(tmp_path / "allow_ctx", [EvalNoGradGuard()], model=EvalsInTrainHook(allow_ctx=True), max_epochs=1)
    for run in ("clean", "allow_hook", "allow_ctx"):
        g = find_summary(tmp_path / run)["eval_no_grad_guard"]
        assert g["clean"] is True and g["findings"] == [] and g["retained_graphs"] == [], run
    assert not [w for w in recwarn if "EvalNoGradGuard" in str(w.message)]


class ManualWithEvalCritic(TinyModel):
    """Manual optimization switched on in the module's own setup (after the callbacks' setup), and an eval-mode
    critic scored with grad on inside training_step, after the backward: legitimate under manual optimization."""

    def __init__(self):
        super().__init__()
        self.critic = nn.Linear(1, 1)

    def setup(self, stage):
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.critic.eval()
        self.critic(self(x).detach()).mean()
        self.critic.train()


@pytest.mark.parametrize("suite", [False, True])
def test_manual_optimization_set_in_the_modules_setup_is_not_watched_inside_the_step(tmp_path, recwarn, suite):
    from lightning_perf import PerfSuite

    guard = EvalNoGradGuard(mode="raise")
    fit(tmp_path, [PerfSuite([guard]) if suite else guard], model=ManualWithEvalCritic(), max_epochs=1)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    assert g["clean"] is True and g["findings"] == []
    assert not [w for w in recwarn if "EvalNoGradGuard" in str(w.message)]


def test_raise_mode_fails_the_fit_with_the_message(tmp_path):
    with pytest.raises(RuntimeError, match=r"EvalNoGradGuard: EvalsInTrainHook.on_train_batch_end ran .*no_grad"):
        fit(tmp_path, [EvalNoGradGuard(mode="raise")], model=EvalsInTrainHook(), max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "failed" and s["eval_no_grad_guard"]["findings"][0]["count"] == 1


class EmaSampler(Callback):
    """A callback that samples from the model after each batch, as EMA and sampling callbacks do."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.eval()
        pl_module(batch[0])
        pl_module.train()


def test_site_names_the_callback(tmp_path):
    with pytest.warns(UserWarning, match="EmaSampler.on_train_batch_end ran TinyModel.forward"):
        fit(tmp_path, [EmaSampler(), EvalNoGradGuard()], max_epochs=1)
    (finding,) = find_summary(tmp_path)["eval_no_grad_guard"]["findings"]
    assert finding["site"] == "EmaSampler.on_train_batch_end" and finding["count"] == 8


def _a_dispatcher_lightning_never_had(hook, *args):
    """Stands for any framework code between Lightning's loop and a hook: its name and locals say nothing."""
    unrelated_locals = {"hook_name": "not_a_hook"}  # noqa: F841 - what a framework frame could hold
    return hook(*args)


@pytest.mark.parametrize("allow", [[], ["on_train_batch_end"]])
def test_sites_are_named_from_the_users_own_hook_frame_whoever_calls_it(allow):
    """The site comes from the user's hook method (its name and its object), not from Lightning's dispatcher
    frames: a release that renames them changes nothing, and `allow=` still matches."""
    guard = EvalNoGradGuard(allow=allow)
    model = TinyModel()
    guard._watch.arm()
    try:
        with pytest.warns(UserWarning, match="EmaSampler.on_train_batch_end ran TinyModel") if not allow else _null():
            _a_dispatcher_lightning_never_had(EmaSampler().on_train_batch_end, None, model, None,
                                              (torch.randn(4, 16),), 0)
    finally:
        guard._watch.disarm()
    findings = guard.findings
    if allow:
        assert findings == []
    else:
        assert [(f["site"], f["hook"], f["count"]) for f in findings] == [
            ("EmaSampler.on_train_batch_end", "on_train_batch_end", 1)]


def test_code_outside_any_hook_method_is_named_by_file_and_line_and_says_allow_cannot_name_it():
    guard = EvalNoGradGuard(allow=["on_train_batch_end"])
    model = TinyModel().eval()
    guard._watch.arm()
    try:
        with pytest.warns(UserWarning, match=r"allow_grad_in_eval\(\):` \(no Callback or LightningModule hook"):
            model(torch.randn(4, 16))
    finally:
        guard._watch.disarm()
    (finding,) = guard.findings
    assert finding["hook"] is None and finding["site"].startswith(__file__ + ":")


class GradInValidation(TinyModel):
    def validation_step(self, batch, batch_idx):
        with torch.enable_grad():
            return super().validation_step(batch, batch_idx)


def test_enable_grad_in_validation_step_with_inference_mode_off(tmp_path):
    with pytest.warns(UserWarning, match="validation_step ran GradInValidation.forward"):
        fit(tmp_path, [EvalNoGradGuard()], model=GradInValidation(), max_epochs=1, inference_mode=False,
            num_sanity_val_steps=0)
    (finding,) = find_summary(tmp_path)["eval_no_grad_guard"]["findings"]
    assert finding["hook"] == "validation_step" and finding["count"] == 4  # 32 samples, batches of 8


def test_no_global_hooks_remain_after_fit(tmp_path):
    from torch.nn.modules import module as module_mod

    before = (len(module_mod._global_forward_pre_hooks), len(module_mod._global_forward_hooks))
    fit(tmp_path, [EvalNoGradGuard()], max_epochs=1)
    assert (len(module_mod._global_forward_pre_hooks), len(module_mod._global_forward_hooks)) == before


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "loud"}, r"EvalNoGradGuard\(mode='loud'\).*warn, raise, fix"),
        ({"allow": ["on_tset_batch_end"]}, r"did you mean 'on_test_batch_end'"),
        ({"allow": "on_test_batch_end"}, r"Expected a list of hook names"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalNoGradGuard(**kwargs)


def test_a_clean_evaluation_runs_without_global_module_hooks_after_its_first_batch(tmp_path):
    """Global module hooks put every nn.Module call on PyTorch's slow path. Validation during fit runs under
    no_grad, where a step may enable grad: its first batch is watched, the rest only when that one found something
    (the test above finds all 4). trainer.validate() runs under inference mode: nothing can build a graph there."""
    from torch import nn

    from helpers import TinyModel
    from lightning_perf import EvalNoGradGuard

    seen = []

    class Probe(TinyModel):
        def validation_step(self, batch, batch_idx):
            seen.append(len(nn.modules.module._global_forward_pre_hooks))
            return super().validation_step(batch, batch_idx)

    model = Probe()
    trainer = Trainer(callbacks=[EvalNoGradGuard()], **trainer_kwargs(tmp_path, max_epochs=1,
                                                                      num_sanity_val_steps=0))
    trainer.fit(model)
    assert seen == [1, 0, 0, 0], seen  # 4 validation batches
    seen.clear()
    trainer.validate(model)
    assert seen == [0, 0, 0, 0], seen


def _watch(found):
    from lightning_perf.measure.evaluation.autograd import EvalForwardWatch

    return EvalForwardWatch(lambda site, hook, module, saved, fixed, model: found.append((module, saved)),
                            lambda hook: False)


class Boom(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(16, 16)

    def forward(self, x):
        self.inner(x)
        raise KeyError("boom")


def test_only_top_level_forwards_are_checked_and_every_per_call_hook_goes_away():
    """An eval-mode child inside a train-mode parent is the parent's business; an eval-mode parent is one finding
    however many children it has; a forward that raises is still closed, and no hook stays on any module."""
    found = []
    watch = _watch(found)
    parent = nn.Sequential(nn.Linear(16, 16), nn.Sequential(nn.Linear(16, 16)).eval())
    evaluated = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)).eval()
    boom = Boom().eval()
    x = torch.randn(8, 16)
    watch.arm()
    try:
        parent(x)
        assert found == []
        evaluated(x)
        assert [m for m, _ in found] == ["Sequential"] and found[0][1] > 0
        with pytest.raises(KeyError):
            boom(x)
        assert [m for m, _ in found] == ["Sequential", "Boom"]
        evaluated(x)  # after the exception, the watch still sees the next top-level forward
        assert len(found) == 3
    finally:
        watch.disarm()
    for module in (*parent.modules(), *evaluated.modules(), *boom.modules()):
        assert not module._forward_hooks and not module._forward_pre_hooks
    evaluated(x)
    assert len(found) == 3 and not watch.armed


def test_a_replaced_torch_hook_dict_is_found_again_at_the_next_phase_start(monkeypatch):
    """The watch keeps torch's dict of global pre-hooks from its first arm (reading torch's module attribute every
    step costs ~1 µs right after a backward); where something replaces that dict, the next phase start (refresh)
    finds the new one, armed or not, and the watch sees forwards again."""
    from collections import OrderedDict

    from lightning_perf.measure.evaluation import autograd

    found = []
    watch = autograd.EvalForwardWatch(lambda site, hook, module, saved, fixed, model: found.append(module),
                                      lambda hook: False)
    evaluated = nn.Linear(4, 4).eval()
    watch.arm()
    evaluated(torch.randn(2, 4))
    assert len(found) == 1
    for armed in (True, False):
        if not armed:
            watch.disarm()
        replaced = OrderedDict(nn.modules.module._global_forward_pre_hooks)
        replaced.pop(watch._handle.id, None)
        monkeypatch.setattr(nn.modules.module, "_global_forward_pre_hooks", replaced)
        watch.refresh()
        watch.arm()
        assert watch._handle.id in replaced
        evaluated(torch.randn(2, 4))
        assert len(found) == (2 if armed else 3)
    watch.disarm()
    assert watch._handle.id not in nn.modules.module._global_forward_pre_hooks


def test_a_dict_replaced_while_armed_loses_the_hook_at_the_next_refresh_when_disarmed(monkeypatch):
    from collections import OrderedDict

    from lightning_perf.measure.evaluation import autograd

    watch = autograd.EvalForwardWatch(lambda *a: None, lambda hook: False)
    watch.arm()
    replaced = OrderedDict(nn.modules.module._global_forward_pre_hooks)  # a copy that still holds the hook
    monkeypatch.setattr(nn.modules.module, "_global_forward_pre_hooks", replaced)
    watch.disarm()
    assert watch._handle.id in replaced  # the disarm took it out of the old dict only
    watch.refresh()
    assert watch._handle.id not in replaced


def test_a_copied_watch_starts_disarmed_and_arms_in_torchs_own_dict():
    import copy
    import pickle

    from lightning_perf.measure.evaluation import autograd

    found = []
    watch = autograd.EvalForwardWatch(_Collect(found), _never)
    watch.arm()
    evaluated = nn.Linear(4, 4).eval()
    for clone in (copy.deepcopy(watch), pickle.loads(pickle.dumps(watch))):
        assert not clone.armed and clone._hooks is None and clone._handle is None
        watch.disarm()
        clone.arm()
        evaluated(torch.randn(2, 4))
        assert clone._handle.id in nn.modules.module._global_forward_pre_hooks
        assert len(clone.on_finding.found) == 1 and found == []  # the clone's own (copied) sink saw it
        clone.disarm()
        assert clone._handle.id not in nn.modules.module._global_forward_pre_hooks
        watch.arm()
    watch.disarm()


class _Collect:
    def __init__(self, found):
        self.found = found

    def __call__(self, site, hook, module, saved, fixed, model):
        self.found.append(module)


def _never(hook):
    return False


@pytest.mark.parametrize("torch_dict", [True, False])
def test_arming_between_steps_puts_one_hook_in_and_takes_it_out(monkeypatch, torch_dict):
    """The watch toggles its one global pre-hook in torch's dict under the id its first registration got (a dict
    store a step); where torch keeps its hooks otherwise, it registers and removes a handle each time."""
    from lightning_perf.measure.evaluation import autograd

    if not torch_dict:
        monkeypatch.setattr(autograd, "_PRE_HOOKS", "_no_such_dict")
    hooks = nn.modules.module._global_forward_pre_hooks
    before = dict(hooks)
    found = []
    watch = autograd.EvalForwardWatch(lambda site, hook, module, saved, fixed, model: found.append(module),
                                      lambda hook: False)
    evaluated = nn.Linear(4, 4).eval()
    ids = set()
    for cycle in range(3):
        watch.arm()
        watch.arm()  # twice in a step: still one hook
        assert watch.armed and len(hooks) == len(before) + 1
        ids |= set(hooks) - set(before)
        evaluated(torch.randn(2, 4))
        assert len(found) == cycle + 1
        watch.disarm()
        assert not watch.armed and dict(hooks) == before
        evaluated(torch.randn(2, 4))  # disarmed: not seen
        assert len(found) == cycle + 1
    assert len(ids) == (1 if torch_dict else 3)
