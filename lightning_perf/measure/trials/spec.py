"""A change of the user's named by import path (``--trial mypkg.switches:on,off``): its form checked without importing
anything (the CLI, before a run), its switches imported where the training runs (docs/trials.md).

Standard library only: the CLI checks the form without torch; the training process imports the module.
"""

from __future__ import annotations

import importlib
import inspect
import keyword
from typing import Any, Callable, List, Tuple

__all__ = ["SWITCH_FORMS", "is_switch_spec", "parse_switch_spec", "load_switches"]

#: What a change of the user's may be written as, in every message that refuses one.
SWITCH_FORMS = ("MODULE:SWITCH_ON,SWITCH_OFF (two functions of (trainer, pl_module)) or MODULE:OBJECT (an object or"
                " class with switch_on and switch_off methods), e.g. mypkg.switches:on,off")


def is_switch_spec(text: str) -> bool:
    """Whether ``text`` is meant as a change of the user's (it has a colon; no built-in change has one)."""
    return ":" in text


def _dotted(text: str) -> bool:
    parts = text.split(".")
    return all(part.isidentifier() and not keyword.iskeyword(part) for part in parts)


def parse_switch_spec(spec: str) -> Tuple[str, List[str]]:
    """``mypkg.switches:on,off`` -> (``mypkg.switches``, [``on``, ``off``]); ``mypkg.switches:Change`` -> (...,
    [``Change``]). ValueError naming the spec, what is wrong and the forms allowed."""
    module, colon, rest = spec.partition(":")
    names = rest.split(",")
    why = None
    if not colon:
        why = "no ':' between the module and the names"
    elif not module:
        why = "no module before ':'"
    elif not _dotted(module):
        why = f"{module!r} is not a module path (dotted Python names)"
    elif not rest:
        why = "no name after ':'"
    elif len(names) > 2:
        why = f"{len(names)} names after ':'; give two functions or one object"
    else:
        bad = next((name for name in names if not _dotted(name)), None)
        if bad is not None:
            why = "an empty name" if not bad else f"{bad!r} is not a Python name"
    if why is not None:
        raise ValueError(f"{spec!r} is not a change of your own ({why}): expected {SWITCH_FORMS}")
    return module, names


def _attribute(module: Any, module_name: str, path: str) -> Any:
    value = module
    for part in path.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {path!r}") from None
    return value


def _check_switch(name: str, switch: Any) -> None:
    if not callable(switch):
        raise ValueError(f"{name!r} is a {type(switch).__name__}, not a function of (trainer, pl_module)")
    try:
        signature = inspect.signature(switch)
    except (TypeError, ValueError):  # a built-in without a signature: its first call will tell
        return
    try:
        signature.bind(None, None)
    except TypeError as err:
        raise ValueError(f"{name!r} cannot be called with (trainer, pl_module) ({err})") from None


def load_switches(spec: str) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """Imports the module of ``spec`` and returns its (switch_on, switch_off); a class named alone is made without
    arguments. ValueError saying why they cannot be used (the form, an import that fails, a name that is missing,
    not callable or not callable with two arguments)."""
    module_name, names = parse_switch_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - whatever the import raises, the change cannot be tried
        raise ValueError(f"cannot import {module_name!r} ({type(err).__name__}: {err})") from None
    found = [_attribute(module, module_name, name) for name in names]
    if len(found) == 2:
        switches = list(zip(names, found))
    else:
        name, obj = names[0], found[0]
        if isinstance(obj, type):
            try:
                obj = obj()
            except Exception as err:  # noqa: BLE001
                raise ValueError(f"class {name!r} cannot be made without arguments ({type(err).__name__}: {err})"
                                 ) from None
        if not (callable(getattr(obj, "switch_on", None)) and callable(getattr(obj, "switch_off", None))):
            raise ValueError(f"{name!r} is a {type(obj).__name__} without switch_on and switch_off methods")
        switches = [(f"{name}.switch_on", obj.switch_on), (f"{name}.switch_off", obj.switch_off)]
    for name, switch in switches:
        _check_switch(name, switch)
    return switches[0][1], switches[1][1]
