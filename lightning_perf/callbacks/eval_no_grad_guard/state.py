"""EvalNoGradGuard's checkpoint state read back: every record checked before anything is assigned."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.measure.evaluation.train_mode import MAX_MODULE_NAMES


def read_state(state_dict: Dict[str, Any]) -> Tuple[Dict[tuple, Any], Dict[str, Any], Dict[tuple, Any]]:
    """The grad findings by (site, module), the retained graphs by attribute and the training-mode findings by
    (phase, site) of a ``state_dict``; :class:`StateError` for one this version cannot read."""
    s = StateReader(state_dict)
    findings = {}
    for f in s.records("findings"):
        entry = {"site": f.text("site", allow_none=False), "hook": f.text("hook"),
                 "module": f.text("module", allow_none=False), "count": f.count("count"),
                 "saved_for_backward_bytes": f.count("saved_for_backward_bytes"), "fixed": f.flag("fixed"),
                 "training_mode": f.flag("training_mode")}
        if entry["site"] is None or entry["module"] is None:
            raise StateError(f"{f.where} lacks its site or module")
        findings[(entry["site"], entry["module"])] = {**f.data, **entry}
    retained = {}
    for r in s.records("retained"):
        record = {"attribute": r.text("attribute", allow_none=False), "seen_at": r.text("seen_at"),
                  "max_count": r.count("max_count"), "max_bytes_kept": r.count("max_bytes_kept"),
                  "epochs_seen": r.count("epochs_seen")}
        if record["attribute"] is None:
            raise StateError(f"{r.where} lacks its attribute")
        retained[record["attribute"]] = {**r.data, **record}
    train_mode = {}
    for f in s.records("train_mode_findings"):
        names = {}
        for key in ("modules", "module_types", "uncounted"):
            names[key] = f.data.get(key, [])
            if not isinstance(names[key], list) or not all(isinstance(n, str) for n in names[key]):
                raise StateError(f"{f.where}.{key} is not a list of names")
        forwards = f.data.get("forwards")
        entry = {"phase": f.text("phase", allow_none=False), "site": f.text("site"), "runs": f.count("runs"),
                 "forwards": None if forwards is None else f.count("forwards"),
                 "uncounted": names["uncounted"][:MAX_MODULE_NAMES], "modules": names["modules"][:MAX_MODULE_NAMES],
                 "module_types": names["module_types"][:MAX_MODULE_NAMES],
                 "module_count": f.count("module_count"),
                 "running_stats_changed": f.flag("running_stats_changed")}
        if entry["phase"] is None:
            raise StateError(f"{f.where} lacks its phase")
        train_mode[(entry["phase"], entry["site"])] = entry
    return findings, retained, train_mode
