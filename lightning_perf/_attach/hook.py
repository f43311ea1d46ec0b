"""Inside the command's Python: patches ``Trainer.__init__`` of ``lightning.pytorch`` and ``pytorch_lightning`` when
the command imports them, so each Trainer it builds gets the suite. Standard library only at import: a command that
never imports Lightning pays a dictionary look-up per import and nothing else."""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from typing import Any, Dict

from lightning_perf._attach import CALLBACKS_ENV, FILL_ENV, is_lightning_perf_callback, record, warn_once

#: The module that defines each namespace's Trainer -> the namespace.
TARGETS = {"lightning.pytorch.trainer.trainer": "lightning.pytorch",
           "pytorch_lightning.trainer.trainer": "pytorch_lightning"}

#: Set on a patched ``__init__``: a module imported twice (a reload) is patched once.
_MARK = "__lightning_perf_run__"


class _TrainerFinder(importlib.abc.MetaPathFinder):
    """Finds the Trainer's module with the other finders and patches it once it has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in TARGETS:
            return None
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_patch(module: Any) -> None:
                exec_module(module)
                patch_module(module)

            spec.loader.exec_module = exec_and_patch  # the loader of this one module: a file loader per module
            return spec
        except Exception as err:  # noqa: BLE001 - the import goes on with the other finders, unpatched
            warn_once("find", f"cannot watch for {fullname} ({type(err).__name__}: {err}); the command runs"
                      " unmeasured")
            return None


def install() -> None:
    """Called by the ``sitecustomize`` of ``lightning-perf run``; does nothing outside such a run."""
    if not os.environ.get(CALLBACKS_ENV):
        return
    if not any(isinstance(finder, _TrainerFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TrainerFinder())
    for name in TARGETS:  # already imported (from a .pth file): patched now
        module = sys.modules.get(name)
        if module is not None:
            patch_module(module)


def patch_module(module: Any) -> None:
    namespace = TARGETS.get(getattr(module, "__name__", ""), "?")
    try:
        trainer_cls = module.Trainer
        original = trainer_cls.__init__
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)  # keeps the signature that LightningCLI and jsonargparse read
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **with_suite(kwargs, namespace))

        setattr(__init__, _MARK, True)
        trainer_cls.__init__ = __init__
        record("patched", namespace=namespace)
    except Exception as err:  # noqa: BLE001
        warn_once("patch", f"cannot attach to {namespace}.Trainer ({type(err).__name__}: {err}); the command runs"
                  " unmeasured")
        record("failed", reason=f"cannot patch {namespace}.Trainer: {type(err).__name__}: {err}")


def with_suite(kwargs: Dict[str, Any], namespace: str) -> Dict[str, Any]:
    """The Trainer's arguments with the suite appended to ``callbacks`` (a new list: the caller's is not changed),
    or unchanged when a lightning_perf callback is there already or the suite cannot be built. Under
    ``lightning-perf matrix`` ($LIGHTNING_PERF_RUN_FILL) the suite holds only the callbacks the Trainer lacks (none
    when it has them all: it then only reports where the Trainer's own callbacks wrote their summary)."""
    try:
        given = kwargs.get("callbacks")
        listed = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        fill = bool(os.environ.get(FILL_ENV))
        if not fill and any(is_lightning_perf_callback(cb) for cb in listed):
            record("left_alone", namespace=namespace)
            return kwargs
        from lightning_perf._attach.suite import build_suite

        suite = build_suite(beside=listed if fill else None)
        record("attached", namespace=namespace, callbacks=[type(cb).__name__ for cb in suite.callbacks])
        return dict(kwargs, callbacks=(tuple(listed) + (suite,)) if isinstance(given, tuple) else listed + [suite])
    except Exception as err:  # noqa: BLE001 - the Trainer is built as the command asked, unmeasured
        reason = f"{type(err).__name__}: {err}"
        warn_once(f"build:{reason}", f"the suite could not be attached to a {namespace} Trainer ({reason}); it runs"
                  " unmeasured")
        record("failed", reason=f"cannot build the suite: {reason}")
        return kwargs
