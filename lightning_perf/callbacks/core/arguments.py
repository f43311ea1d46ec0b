"""Constructor argument checks of the suite: each error names the call, the bad value and what is allowed."""

from __future__ import annotations

import math
import os
from typing import Any, Optional


def bad_argument(owner: str, name: str, value: Any, allowed: str) -> ValueError:
    """The constructor error of the suite: names the call, the bad value and what is allowed."""
    return ValueError(f"Unsupported parameter value `{owner}({name}={value!r})`. {allowed}")


def check_positive_int(owner: str, name: str, value: Any, allow_none: bool = False, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if allow_none else ""
        raise bad_argument(owner, name, value, f"Expected an integer >= {minimum}{extra}.")


def check_bool(owner: str, name: str, value: Any) -> bool:
    """A real bool: ``enabled="false"`` is truthy and would silently do the opposite of what was meant."""
    if not isinstance(value, bool):
        raise bad_argument(owner, name, value, "Expected True or False.")
    return value


def check_number(owner: str, name: str, value: Any, minimum: Optional[float] = None, allow_none: bool = False,
                 what: str = "a number", above: Optional[float] = None) -> Optional[float]:
    """A finite int or float (not a bool, not NaN), at least ``minimum`` and more than ``above`` when given."""
    if value is None and allow_none:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (minimum is not None and value < minimum) or (above is not None and value <= above)):
        bound = f" > {above:g}" if above is not None else (f" >= {minimum:g}" if minimum is not None else "")
        raise bad_argument(owner, name, value, f"Expected {what}{bound} (finite){' or None' if allow_none else ''}.")
    return float(value)


def check_text(owner: str, name: str, value: Any) -> Optional[str]:
    """None or a string (a run's name or notes for `report`)."""
    if value is not None and not isinstance(value, str):
        raise bad_argument(owner, name, value, "Expected a string or None.")
    return value


def check_path(owner: str, name: str, value: Any) -> Optional[str]:
    """None, a string or an ``os.PathLike`` without a NUL byte: ``summary_path=123`` would write a file named 123."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise bad_argument(owner, name, value, "Expected a file path (a non-empty string or os.PathLike) or None.")
    if "\0" in value:  # no file can have it: the run would train and then write nowhere
        raise bad_argument(owner, name, value, "A file path cannot contain a NUL byte ('\\x00').")
    return value
