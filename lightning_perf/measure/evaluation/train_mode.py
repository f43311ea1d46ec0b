"""Evaluation run with modules in training mode: BatchNorm updating its running statistics, Dropout dropping.
No Lightning import here."""

from __future__ import annotations

from typing import Any, Collection, Dict, List, Optional, Tuple

import torch
from torch import nn

__all__ = ["MAX_MODULE_NAMES", "mode_dependent", "ModesBetweenSteps", "TrainModeWatch"]

#: The most module names a finding lists; ``module_count`` says how many there were in all.
MAX_MODULE_NAMES = 16

#: Kinds of mode-dependent modules: those whose statistics a training-mode forward updates (read from their own
#: counters), and those that drop or randomise in training mode (seen by a forward pre-hook).
RUNNING_STATS = "running_stats"
RANDOM = "random"


def mode_dependent(module: nn.Module) -> Optional[str]:
    """What a module does differently in training mode: ``"running_stats"`` (BatchNorm and SyncBatchNorm tracking
    running statistics: it normalises with the batch's statistics and updates its running ones), ``"random"``
    (Dropout of any kind with p > 0, MultiheadAttention with dropout, RReLU), or None (the same in both modes)."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        # without running statistics it normalises with the batch's in both modes
        return RUNNING_STATS if module.track_running_stats and module.num_batches_tracked is not None else None
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return RANDOM if module.p > 0 else None
    if isinstance(module, nn.MultiheadAttention):
        return RANDOM if module.dropout > 0 else None
    if isinstance(module, nn.RReLU):
        return RANDOM
    return None


def _is_compiled(module: nn.Module) -> bool:
    """A ``torch.compile``'d module (``OptimizedModule``), found without importing the compiler."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def _stack(tensors: List[torch.Tensor]) -> torch.Tensor:
    """The counters side by side, on their device: one kernel, no sync."""
    try:
        return torch.stack([t.reshape(()) for t in tensors])
    except RuntimeError:  # a model split over devices: its counters are read one by one (a sync each)
        return torch.stack([t.reshape(()).to("cpu") for t in tensors])


class TrainModeWatch:
    """Finds the mode-dependent modules of a model that ran in training mode during one evaluation run.

    :meth:`start` lists the model's mode-dependent modules (:func:`mode_dependent`), takes a copy of the BatchNorm
    counters (``num_batches_tracked``, which each training-mode forward advances; no sync) and puts a forward
    pre-hook on the others, which counts their forwards in training mode. :meth:`quiet` takes those hooks off (the
    forwards then take PyTorch's fast path again), :meth:`watch` puts them back. :meth:`stop` reads the counters
    (one sync where they live on a GPU: at the end of an evaluation run, where it costs nothing), takes the hooks
    off and says what ran in training mode.

    Inside a ``torch.compile``'d module the compiled code does not run hooks put on its submodules after it was
    compiled: there a random-kind module's training flag, read at the run's start, at each :meth:`note_modes` (a
    batch start) and at its end, says it was in training mode, and its forwards are not counted (None).
    """

    def __init__(self) -> None:
        self.running = False
        self.phase: Optional[str] = None
        self.site: Optional[str] = None
        self._stats: List[Tuple[str, nn.Module]] = []  # (qualified name, module) of the BatchNorm kind
        self._random: List[Tuple[str, nn.Module]] = []  # and of the random kind
        self._in_order: List[Tuple[str, nn.Module]] = []  # both, in the model's order (the order findings use)
        self._counters_at_start: Optional[torch.Tensor] = None
        self._random_forwards: List[int] = []  # training-mode forwards of each random-kind module this run
        self._compiled: List[int] = []  # indices of the random-kind modules inside a compiled module
        self._seen_training: List[bool] = []  # and whether each was seen in training mode at a check this run
        self._handles: List[Any] = []

    def __getstate__(self) -> Dict[str, Any]:
        """A copy holds no modules, tensors or hook handles: it starts idle."""
        state = self.__dict__.copy()
        state.update(running=False, _stats=[], _random=[], _in_order=[], _counters_at_start=None, _random_forwards=[],
                     _handles=[], _compiled=[], _seen_training=[])
        return state

    def start(self, model: nn.Module, phase: str, site: Optional[str] = None) -> None:
        """Begins watching ``model`` for one evaluation run of ``phase``; ``site`` names the code that ran it."""
        if self.running:
            self.stop()
        self._in_order = [(name, module) for name, module in model.named_modules() if mode_dependent(module)]
        self._stats = [(name, m) for name, m in self._in_order if mode_dependent(m) == RUNNING_STATS]
        self._random = [(name, m) for name, m in self._in_order if mode_dependent(m) == RANDOM]
        with torch.no_grad():
            self._counters_at_start = (_stack([m.num_batches_tracked for _, m in self._stats]).clone()
                                       if self._stats else None)
        self._random_forwards = [0] * len(self._random)
        compiled = [name + "." for name, m in model.named_modules() if _is_compiled(m)]
        self._compiled = [i for i, (name, _) in enumerate(self._random) if name.startswith(tuple(compiled))]
        self._seen_training = [False] * len(self._random)
        self.phase, self.site, self.running = phase, site, True
        self.note_modes()
        self.watch()

    def watch(self) -> None:
        """Counts the random-kind modules' forwards in training mode (a forward pre-hook on each)."""
        if self._handles or not self.running:
            return
        for index, (_, module) in enumerate(self._random):
            self._handles.append(module.register_forward_pre_hook(self._counter(index)))

    def _counter(self, index: int) -> Any:
        forwards = self._random_forwards

        def count(module: nn.Module, args: Any) -> None:
            if module.training:
                forwards[index] += 1

        return count

    def quiet(self) -> None:
        """Takes the forward pre-hooks off."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def watching(self) -> bool:
        return bool(self._handles)

    def note_modes(self) -> bool:
        """Whether a random-kind module is in training mode now (a read of each one's flag); those inside a compiled
        module are noted as seen so."""
        found = False
        for _, module in self._random:
            if module.training:
                found = True
                break
        if found:
            for i in self._compiled:
                if self._random[i][1].training:
                    self._seen_training[i] = True
        return found

    @property
    def found_random(self) -> bool:
        """Whether a random-kind module ran in training mode in this run so far."""
        return any(self._random_forwards)

    def stop(self) -> Optional[Dict[str, Any]]:
        """Ends the run: None when nothing ran in training mode, else ``phase``, ``site``, ``forwards`` (the
        training-mode forwards of the module that had most: a model's forwards, where each runs every such module
        once), ``modules`` (qualified name -> (class name, training-mode forwards), in the model's order),
        ``running_stats_changed`` (whether any BatchNorm counter moved), ``random_active`` (whether a Dropout-like
        module ran in training mode), ``uncounted`` (modules inside a compiled module seen in training mode, whose
        forwards are None); ``forwards`` is None where only such modules were found."""
        if not self.running:
            return None
        self.note_modes()
        self.quiet()
        self.running = False
        stats, random, before, in_order = self._stats, self._random, self._counters_at_start, self._in_order
        self._stats, self._random, self._in_order, self._counters_at_start = [], [], [], None
        moved: List[int] = []
        if stats:
            with torch.no_grad():
                moved = [max(int(n), 0) for n in (_stack([m.num_batches_tracked for _, m in stats]) - before).tolist()]
        counts = {name: (type(m).__name__, n) for (name, m), n in zip(stats, moved) if n > 0}
        counts.update({name: (type(m).__name__, n) for (name, m), n in zip(random, self._random_forwards) if n > 0})
        uncounted = {random[i][0]: (type(random[i][1]).__name__, None) for i in self._compiled
                     if self._seen_training[i] and not self._random_forwards[i]}
        counts.update(uncounted)
        if not counts:
            return None
        position = {name: i for i, (name, _) in enumerate(in_order)}
        modules = dict(sorted(counts.items(), key=lambda item: position[item[0]]))
        known = [n for _, n in modules.values() if n is not None]
        return {"phase": self.phase, "site": self.site, "forwards": max(known) if known else None,
                "modules": modules, "running_stats_changed": any(n > 0 for n in moved),
                "random_active": any(n > 0 for n in self._random_forwards) or bool(uncounted),
                "uncounted": list(uncounted)}

    def abandon(self) -> None:
        """Ends the run without reading anything (after a failure)."""
        self.quiet()
        self.running = False
        self._stats, self._random, self._in_order, self._counters_at_start = [], [], [], None


class ModesBetweenSteps:
    """Evaluation a training hook runs between training steps: which mode-dependent modules of the module it runs
    are in training mode, at each top-level forward, and which of those the forward ran.

    A top-level module's mode-dependent modules are listed at its first forward (named within ``root``, the
    LightningModule), then only their ``training`` flags are read: a few attribute reads a forward. Which of them
    ran is seen by the caller's global forward pre-hook (a GAN's ``self(z)`` runs its generator, not the Dropout of
    its discriminator); inside a ``torch.compile``'d module, whose compiled code may not call that hook, every one
    in training mode is taken to have run.
    """

    def __init__(self) -> None:
        self._listed: Dict[int, List[Tuple[str, nn.Module, str]]] = {}
        self._compiled: Dict[int, bool] = {}

    def reset(self) -> None:
        self._listed, self._compiled = {}, {}

    def __getstate__(self) -> Dict[str, Any]:
        """A copy holds no modules."""
        return {"_listed": {}, "_compiled": {}}

    def training(self, module: nn.Module, root: Optional[nn.Module]) -> Dict[int, Tuple[str, nn.Module, str]]:
        """The mode-dependent modules of ``module`` in training mode now, by id: (qualified name, module, kind)."""
        listed = self._listed.get(id(module))
        if listed is None:
            prefix = next((n for n, m in root.named_modules() if m is module), "") if root is not None else ""
            listed = self._listed[id(module)] = [(".".join(p for p in (prefix, name) if p), m, kind)
                                                 for name, m in module.named_modules()
                                                 for kind in (mode_dependent(m),) if kind]
            self._compiled[id(module)] = any(_is_compiled(m) for m in module.modules())
        return {id(m): (name, m, kind) for name, m, kind in listed if m.training}

    def found(self, module: nn.Module, training: Dict[int, Tuple[str, nn.Module, str]],
              ran: Collection[int]) -> Optional[Dict[str, Any]]:
        """None when none of ``training`` (from :meth:`training`) ran in this forward of ``module``; else a finding
        in the form of :meth:`TrainModeWatch.stop`'s (one forward, no phase or site: the caller names them)."""
        every = self._compiled.get(id(module), False)
        ran_ = [(name, m, kind) for i, (name, m, kind) in training.items() if every or i in ran]
        if not ran_:
            return None
        return {"forwards": 1, "modules": {name: (type(m).__name__, 1) for name, m, _ in ran_},
                "running_stats_changed": any(kind == RUNNING_STATS for _, _, kind in ran_),
                "random_active": any(kind == RANDOM for _, _, kind in ran_), "uncounted": []}
