"""Typed reads of a callback's checkpoint state: a value this version cannot use raises StateError naming its key."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from lightning_perf.measure.stats.streaming import MAX_COUNT, BlockSeries, LogHistogram


class StateError(ValueError):
    """A callback's state in a checkpoint that this version cannot read (another version's, edited by hand)."""


class StateReader:
    """Reads one dict of checkpoint state. A missing key gives the default (older checkpoints lack newer keys); a
    present key of the wrong type raises :class:`StateError`, so a loader reads everything before it assigns
    anything and a malformed state leaves nothing half-loaded.

    Args:
        data: the state.
        where: its path in the state, for the error (``"sections.forward"``).
    """

    def __init__(self, data: Any, where: str = "the state") -> None:
        if not isinstance(data, dict):
            raise StateError(f"{where} is a {type(data).__name__}, expected a dict")
        self.data: Dict[Any, Any] = data
        self.where = where

    def _name(self, key: str) -> str:
        return key if self.where == "the state" else f"{self.where}.{key}"

    def _bad(self, key: str, expected: str) -> StateError:
        value = repr(self.data[key])
        value = value if len(value) <= 60 else value[:57] + "..."
        return StateError(f"{self._name(key)} is {value}, expected {expected}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def count(self, key: str, default: int = 0) -> int:
        """An integer from 0 to ``MAX_COUNT`` (an integral float from a hand-edited file is accepted)."""
        if key not in self.data:
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1 < value <= MAX_COUNT \
                or value != int(value):
            raise self._bad(key, f"an integer from 0 to {MAX_COUNT}")
        return int(value)

    def number(self, key: str, default: Optional[float] = 0.0, minimum: Optional[float] = 0.0,
               allow_none: bool = False) -> Optional[float]:
        """A finite number, at least ``minimum`` when given; None only where ``allow_none``."""
        if key not in self.data:
            return default
        value = self.data[key]
        if value is None and allow_none:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or (minimum is not None and value < minimum)):
            bound = f" >= {minimum:g}" if minimum is not None else ""
            raise self._bad(key, f"a finite number{bound}{' or None' if allow_none else ''}")
        return float(value)

    def text(self, key: str, default: Optional[str] = None, allow_none: bool = True) -> Optional[str]:
        if key not in self.data:
            return default
        value = self.data[key]
        if not (isinstance(value, str) or (value is None and allow_none)):
            raise self._bad(key, "a string" + (" or None" if allow_none else ""))
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        if key not in self.data:
            return default
        if not isinstance(self.data[key], bool):
            raise self._bad(key, "True or False")
        return self.data[key]

    def mapping(self, key: str, allow_none: bool = False) -> Optional["StateReader"]:
        """A nested dict as a reader (an empty one when missing); None for a None value where ``allow_none``."""
        if key not in self.data:
            return StateReader({}, self._name(key))
        if self.data[key] is None and allow_none:
            return None
        return StateReader(self.data[key], self._name(key))

    def records(self, key: str) -> List["StateReader"]:
        """A list of dicts, each as a reader (an empty list when missing)."""
        if key not in self.data:
            return []
        value = self.data[key]
        if not isinstance(value, (list, tuple)):
            raise self._bad(key, "a list")
        return [StateReader(item, f"{self._name(key)}[{i}]") for i, item in enumerate(value)]

    def histogram(self, key: str, default: Optional[LogHistogram] = None) -> Optional[LogHistogram]:
        """A :class:`LogHistogram` written by ``to_dict``, or ``default`` when the key is missing."""
        if key not in self.data:
            return default
        try:
            return LogHistogram.from_dict(StateReader(self.data[key], self._name(key)).data)
        except ValueError as err:
            raise StateError(f"{self._name(key)}: {err}") from None

    def series(self, key: str, default: Optional[BlockSeries] = None) -> Optional[BlockSeries]:
        """A :class:`BlockSeries` written by ``to_dict``, or ``default`` when the key is missing."""
        if key not in self.data:
            return default
        try:
            return BlockSeries.from_dict(StateReader(self.data[key], self._name(key)).data)
        except ValueError as err:
            raise StateError(f"{self._name(key)}: {err}") from None
