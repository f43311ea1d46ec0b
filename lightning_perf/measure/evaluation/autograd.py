"""Autograd probes: forwards of eval-mode modules that run with grad on, the bytes they save for a backward that
never runs, and tensors with autograd graphs kept alive in containers. No Lightning import here."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Collection, Dict, FrozenSet, Iterator, Optional, Set, Tuple

import torch
from torch import nn

__all__ = ["allow_grad_in_eval", "EvalForwardWatch", "find_retained_graphs", "graph_saved_bytes"]

_allowed = threading.local()


@contextlib.contextmanager
def allow_grad_in_eval() -> Iterator[None]:
    """Marks code that needs gradients in evaluation on purpose (attribution maps, test-time optimisation).

    Nothing that runs inside is reported by :class:`~lightning_perf.EvalNoGradGuard`, and ``mode="fix"`` leaves it
    alone.

    Example::

        with lightning_perf.allow_grad_in_eval():
            saliency = torch.autograd.grad(model(x).sum(), x)[0]
    """
    _allowed.depth = getattr(_allowed, "depth", 0) + 1
    try:
        yield
    finally:
        _allowed.depth -= 1


def grad_in_eval_allowed() -> bool:
    return getattr(_allowed, "depth", 0) > 0


def calling_site(hooks: FrozenSet[str], owners: Tuple[type, ...]) -> Tuple[str, Optional[str]]:
    """(site, hook name) of the code running now: the innermost frame of a method named like a hook (in ``hooks``)
    on an object of one of the ``owners`` types, e.g. ``"EmaSampler.on_train_batch_end"``; else (``file:line`` of the
    innermost frame outside torch and this package, None). Only the user's own frames are read: nothing of the
    framework that called them."""
    frame = sys._getframe(2)
    user_frame = None
    while frame is not None:
        code = frame.f_code
        if code.co_name in hooks:
            owner = frame.f_locals.get("self")
            if isinstance(owner, owners):
                return f"{type(owner).__name__}.{code.co_name}", code.co_name
        if user_frame is None and "torch" not in code.co_filename and "lightning_perf" not in code.co_filename:
            user_frame = f"{code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return user_frame or "<unknown>", None


#: torch's dict of global forward pre-hooks (what ``register_module_forward_pre_hook`` fills), in
#: ``torch.nn.modules.module``. Where a torch keeps them otherwise, every arm registers and every disarm removes a
#: handle.
_PRE_HOOKS = "_global_forward_pre_hooks"


class EvalForwardWatch:
    """Watches forwards of eval-mode modules while autograd is on, between :meth:`arm` and :meth:`disarm`.

    A global module hook exists only while armed, so forwards in the training step take PyTorch's fast path. Each
    top-level forward while armed registers a forward hook on its module for that call (its end); nested forwards
    cost a test; only an offending top-level forward pays for a stack walk and a ``saved_tensors_hooks``
    that sums the bytes autograd saves (distinct storages). With ``fix=True`` such a forward runs under
    ``torch.no_grad()`` instead.

    Between training steps the guard also names the LightningModule's modules (``model_ids``: those with
    parameters): a top-level forward of one of them there is evaluation in a training hook whatever its mode
    (``self.net.eval(); self(x)`` runs a module in training mode around an eval-mode one), so it is an offending
    forward when autograd is on, and ``on_model_forward`` sees each such forward first (the guard's training-mode
    check). It may return ids of modules to look for: the watch then notes which of them that forward ran (its
    nested calls pass its pre-hook anyway) and gives them to ``on_model_forward_end`` at the forward's end, so a
    finding names what ran, not every module in training mode. Outside the training step only: the step's own
    forwards run with the watch disarmed.

    Args:
        on_finding: called after each offending forward with (site, hook, module class name, saved bytes, fixed,
            whether the module was in training mode: one of the LightningModule's, between training steps).
        is_allowed: (hook name or None) -> whether this site is allowed to run with grad on.
        fix: run offending forwards under ``torch.no_grad()``.
        hooks: method names that are hooks (a site is named after the innermost one on the stack).
        owners: the types whose methods of those names are hooks (callbacks, modules).
    """

    def __init__(self, on_finding: Callable[[str, Optional[str], str, int, bool, bool], None],
                 is_allowed: Callable[[Optional[str]], bool], fix: bool = False,
                 hooks: FrozenSet[str] = frozenset(), owners: Tuple[type, ...] = ()) -> None:
        self.on_finding = on_finding
        self.is_allowed = is_allowed
        self.fix = fix
        self.hooks = hooks
        self.owners = owners
        self._handle: Any = None  # the global forward pre-hook's handle, from the first arm on
        self._hooks: Optional[Dict[Any, Any]] = None  # torch's dict of global pre-hooks, found at the first arm
        #: Whether the watch is armed (read it, never set it: :meth:`arm` and :meth:`disarm` do). An attribute,
        #: not a property: the guard reads it at every training batch end, where a property is a Python call.
        self.armed = False
        self._outer: Optional[nn.Module] = None  # the top-level module whose forward runs now
        self._outer_handle: Any = None  # its one-shot forward hook
        self._depth = 0  # re-entrant calls of that module
        self._active: Optional[Dict[str, Any]] = None
        #: ids of the LightningModule's modules with parameters while between training steps, else None (set by
        #: the guard); and what sees each top-level forward of one of them there.
        self.model_ids: Optional[FrozenSet[int]] = None
        self.on_model_forward: Optional[Callable[[nn.Module], Optional[Collection[int]]]] = None
        self.on_model_forward_end: Optional[Callable[[nn.Module, Set[int]], None]] = None
        #: Whether the module of the finding being reported held modules in eval mode (read by ``on_finding``).
        self.eval_inside = False
        self._look_for: Collection[int] = ()  # ids on_model_forward asked for, in the top-level forward now
        self._ran: Optional[Set[int]] = None  # those of them that forward ran so far

    def arm(self) -> None:
        """One global forward pre-hook; the end of a top-level forward is seen by a hook on that module alone,
        registered for that call. Registered once (torch's API gives it its id); arming again between training
        steps puts it back in torch's dict of global pre-hooks under that id, disarming takes it out: a dict
        store each, where a registration makes a handle and a weak reference every step. The dict is found again
        at each :meth:`refresh` (a phase start), not every step: reading torch's module attribute right after a
        step's work costs about a microsecond."""
        if self.armed:
            return
        if self._outer is not None or self._active is not None:
            self._end_outer()
        hooks = self._hooks
        if hooks is not None:
            hooks[self._handle.id] = self._pre
        else:  # the first arm, or torch keeps its hooks elsewhere (a handle each arm)
            self._handle = nn.modules.module.register_module_forward_pre_hook(self._pre)
            hooks = getattr(nn.modules.module, _PRE_HOOKS, None)
            self._hooks = hooks if isinstance(hooks, dict) and self._handle.id in hooks else None
        self.armed = True

    def disarm(self) -> None:
        if self.armed:
            hooks = self._hooks
            if hooks is not None:
                hooks.pop(self._handle.id, None)
            else:
                self._handle.remove()
                self._handle = None
            self.armed = False
        if self._outer is not None or self._active is not None:
            self._end_outer()

    def refresh(self) -> None:
        """Finds torch's dict of global pre-hooks again (a library that replaced it): at each phase start."""
        if self._hooks is None:  # nothing registered yet, or torch keeps its hooks elsewhere
            return
        hooks = getattr(nn.modules.module, _PRE_HOOKS, None)
        hooks = hooks if isinstance(hooks, dict) else None
        if hooks is not self._hooks:
            self._hooks.pop(self._handle.id, None)
            if hooks is None:
                if self.armed:
                    self._handle = nn.modules.module.register_module_forward_pre_hook(self._pre)
            elif self.armed:
                hooks[self._handle.id] = self._pre
            else:  # a copy of the old dict (disarmed there, maybe not in the copy)
                hooks.pop(self._handle.id, None)
        self._hooks = hooks

    def __getstate__(self) -> Dict[str, Any]:
        """A copy starts disarmed, holding none of torch's hooks or dicts: it registers its own at its first arm."""
        state = self.__dict__.copy()
        state.update(_hooks=None, _handle=None, _outer=None, _outer_handle=None, _active=None, armed=False, _depth=0,
                     model_ids=None, _look_for=(), _ran=None)
        return state

    def _end_outer(self) -> Optional[Dict[str, Any]]:
        if self._outer_handle is not None:
            self._outer_handle.remove()
        outer, ran = self._outer, self._ran
        self._outer = self._outer_handle = self._ran = None
        self._look_for = ()
        self._depth = 0
        if ran is not None and outer is not None and self.on_model_forward_end is not None:
            self.on_model_forward_end(outer, ran)
        return self._close() if self._active is not None else None

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self._outer is not None:  # inside a top-level forward: only its own re-entrant calls are counted
            if module is self._outer:
                self._depth += 1
            elif self._ran is not None and id(module) in self._look_for:
                self._ran.add(id(module))
            return
        self._outer, self._depth = module, 1
        self._outer_handle = module.register_forward_hook(self._post, always_call=True)
        model = self.model_ids is not None and id(module) in self.model_ids
        if model and self.on_model_forward is not None:
            look_for = self.on_model_forward(module)
            if look_for:
                self._look_for = look_for
                self._ran = {id(module)} if id(module) in look_for else set()
        if (module.training and not model) or not torch.is_grad_enabled() or grad_in_eval_allowed():
            return
        site, hook = calling_site(self.hooks, self.owners)
        if self.is_allowed(hook):
            return
        if self.fix and not module.training:  # a training-mode forward may be training on purpose: reported only
            ctx: Any = torch.no_grad()
        else:
            # Parameters stay alive anyway: only what the forward adds is counted.
            seen: Set[int] = {p.untyped_storage().data_ptr() for p in module.parameters()}
            counter = {"bytes": 0}

            def pack(tensor: torch.Tensor) -> torch.Tensor:
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key not in seen:
                    seen.add(key)
                    counter["bytes"] += storage.nbytes()
                return tensor

            ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            self._counter = counter
        ctx.__enter__()
        # a training-mode module holding eval-mode ones: `self.net.eval(); self(x)` (a walk, on a finding only)
        eval_inside = module.training and any(not m.training for m in module.modules())
        self._active = {"ctx": ctx, "site": site, "hook": hook, "module": type(module).__name__,
                        "training": module.training, "fixed": self.fix and not module.training,
                        "eval_inside": eval_inside}

    def _close(self) -> Dict[str, Any]:
        active, self._active = self._active, None
        active["ctx"].__exit__(None, None, None)
        return active

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if module is not self._outer:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        active = self._end_outer()
        if active is not None:
            fixed = active["fixed"]
            saved = 0 if fixed else self._counter["bytes"]
            self.eval_inside = active["eval_inside"]
            self.on_finding(active["site"], active["hook"], active["module"], saved, fixed, active["training"])


def graph_saved_bytes(tensor: torch.Tensor, seen: Set[int], max_nodes: int = 10_000) -> int:
    """Bytes of the distinct storages a tensor's autograd graph holds for backward (``_saved_*`` of each node)."""
    total = 0
    stack = [tensor.grad_fn]
    visited: Set[int] = set()
    while stack and len(visited) < max_nodes:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # noqa: BLE001 - a freed buffer raises on access
                continue
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, torch.Tensor):
                    storage = item.untyped_storage()
                    if storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        total += storage.nbytes()
        stack.extend(fn for fn, _ in node.next_functions if fn is not None)
    return total


def tensors_with_graphs(value: Any, depth: int) -> Iterator[torch.Tensor]:
    """The tensors with an autograd graph in ``value``: a tensor, or lists, tuples and dicts of them nested ``depth``
    levels."""
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield value
        return
    if depth == 0:
        return
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_with_graphs(item, depth - 1)


def find_retained_graphs(obj: Any, depth: int = 3, skip: Tuple[str, ...] = ()) -> Dict[str, Dict[str, int]]:
    """Attributes of ``obj`` holding containers (lists, dicts, tuples, nested ``depth - 1`` levels) of tensors that
    carry an autograd graph: attribute -> {count, tensor_bytes, graph_bytes}."""
    found: Dict[str, Dict[str, int]] = {}
    for name, value in vars(obj).items():
        if name in skip or name.startswith("_") or not isinstance(value, (list, dict, tuple)):
            continue
        tensors = list(tensors_with_graphs(value, depth))
        if not tensors:
            continue
        seen: Set[int] = set()
        tensor_bytes = graph_bytes = 0
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                tensor_bytes += storage.nbytes()
            graph_bytes += graph_saved_bytes(t, seen)
        found[name] = {"count": len(tensors), "tensor_bytes": tensor_bytes, "graph_bytes": graph_bytes}
    return found
