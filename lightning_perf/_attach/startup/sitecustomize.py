"""Run by Python at start-up in a command of ``lightning-perf run``: installs the hook that attaches the suite to
every Trainer, then runs the ``sitecustomize`` this one shadows, as Python would have. Never raises for its own
part: a failure warns once and the command runs unmeasured."""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _is_here(entry):
    try:
        return bool(entry) and _os.path.abspath(entry) == _HERE
    except Exception:  # noqa: BLE001
        return False


def _own_lightning_perf():
    """The lightning_perf this file belongs to, for a Python that has none installed (the baseline checkout's
    environment): that package alone is loaded from there, its dependencies come from the command's environment."""
    import importlib.machinery
    import importlib.util

    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_HERE)))
    spec = importlib.machinery.PathFinder.find_spec("lightning_perf", [root])
    if spec is None or spec.loader is None:
        raise ImportError(f"no lightning_perf package in {root}")
    module = importlib.util.module_from_spec(spec)
    _sys.modules["lightning_perf"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del _sys.modules["lightning_perf"]
        raise


def _attach():
    try:
        _sys.path[:] = [entry for entry in _sys.path if not _is_here(entry)]  # the command sees its own sys.path
        if not _os.environ.get("LIGHTNING_PERF_RUN_CALLBACKS"):
            return
        import importlib

        try:
            importlib.import_module("lightning_perf")
        except ImportError:
            _own_lightning_perf()
        from lightning_perf._attach import hook

        hook.install()
    except Exception as err:  # noqa: BLE001
        try:
            _sys.stderr.write(f"lightning-perf run: the suite could not be attached ({type(err).__name__}: {err});"
                              " the command runs unmeasured\n")
        except Exception:  # noqa: BLE001
            pass


def _chain():
    """Runs the next ``sitecustomize`` on sys.path (this folder is off it by now) under the same name; an error in it
    reaches site.py, which reports it as it would have without us."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    _sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_attach()
_chain()
