"""The CUDA allocator's recorded history: switch it on and off, dump a snapshot (pickle and PyTorch's HTML views), and
read the largest live allocations and a failed request, each with the Python frame that made it. No Lightning
import here."""

from __future__ import annotations

import importlib.util
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple

MB = 1024.0 * 1024.0
#: Frames kept per allocation in the summary (innermost first; the whole stack is in the pickle).
FRAMES_KEPT = 6
#: The HTML views of ``torch.cuda._memory_viz`` written beside each snapshot, where the installed torch has them.
HTML_VIEWS = ("trace_plot", "segment_plot")


def memory_backend() -> Any:
    """``torch.cuda.memory`` (``_record_memory_history``, ``_snapshot``); a function so tests can simulate it."""
    import torch.cuda.memory

    return torch.cuda.memory


def viz_backend() -> Any:
    """``torch.cuda._memory_viz`` (the HTML views), or None where the installed torch has none."""
    try:
        import torch.cuda._memory_viz as viz
    except Exception:  # noqa: BLE001 - an older or trimmed torch: the pickle alone
        return None
    return viz


def start_recording(backend: Any, max_entries: int, stacks: str) -> None:
    backend._record_memory_history(enabled="all", stacks=stacks, max_entries=max_entries)


def stop_recording(backend: Any) -> None:
    backend._record_memory_history(enabled=None)


def _library_dirs() -> Tuple[str, ...]:
    """Folders of the libraries whose frames are not the user's: torch, Lightning and this package."""
    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    for name in ("torch", "lightning", "pytorch_lightning", "lightning_fabric"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append(os.path.abspath(location))
    return tuple(d + os.sep for d in dirs)


def _frame_text(frame: Dict[str, Any]) -> str:
    return f"{frame.get('filename')}:{frame.get('line')} in {frame.get('name')}"


def _user_frame(frames: List[Dict[str, Any]], library: Tuple[str, ...]) -> Optional[str]:
    """The innermost frame outside torch, Lightning and lightning_perf: the line of the user's code that allocated."""
    for frame in frames:
        name = str(frame.get("filename") or "")
        if name and not name.startswith("<") and not os.path.abspath(name).startswith(library):
            return _frame_text(frame)
    return None


def _described(size: int, frames: List[Dict[str, Any]], library: Tuple[str, ...]) -> Dict[str, Any]:
    return {"size_mb": size / MB, "frame": _user_frame(frames, library),
            "frames": [_frame_text(f) for f in frames[:FRAMES_KEPT]]}


def top_allocations(snapshot: Dict[str, Any], k: int) -> List[Dict[str, Any]]:
    """The ``k`` largest live blocks (``active_allocated``), largest first, each with its frames."""
    library = _library_dirs()
    blocks = [b for seg in snapshot.get("segments") or () for b in seg.get("blocks") or ()
              if b.get("state") == "active_allocated"]
    blocks.sort(key=lambda b: -int(b.get("size") or 0))
    return [dict(_described(int(b.get("requested_size") or b.get("size") or 0), _frames_of(b), library),
                 block_mb=int(b.get("size") or 0) / MB) for b in blocks[:k]]


def _frames_of(block: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A block's frames: ``frames`` (torch 2.1 on), else its first ``history`` entry's (older snapshots)."""
    if "frames" in block:
        return block.get("frames") or []
    history = block.get("history") or [{}]
    return history[0].get("frames") or []


def failed_request(snapshot: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The last allocation the allocator could not serve (a trace entry ``oom``): its size, the device's free memory
    then, and its frames; None where the recorded history has none."""
    library = _library_dirs()
    for trace in snapshot.get("device_traces") or ():
        for entry in reversed(trace or ()):
            if entry.get("action") == "oom":
                out = _described(int(entry.get("size") or 0), entry.get("frames") or [], library)
                free = entry.get("device_free")
                out["device_free_mb"] = free / MB if isinstance(free, (int, float)) else None
                return out
    return None


def totals(snapshot: Dict[str, Any]) -> Dict[str, Any]:
    segments = snapshot.get("segments") or ()
    return {"allocated_mb": sum(int(s.get("allocated_size") or 0) for s in segments) / MB,
            "reserved_mb": sum(int(s.get("total_size") or 0) for s in segments) / MB,
            "trace_entries": sum(len(t or ()) for t in snapshot.get("device_traces") or ())}


def dump(backend: Any, base: str, html: bool, top_k: int) -> Dict[str, Any]:
    """Takes a snapshot, writes ``<base>.pickle`` and each HTML view (``<base>.<view>.html``) and returns what the
    summary keeps: paths, totals, the top allocations and the failed request. A view that fails is a reason under
    ``unavailable``, never an error."""
    snapshot = backend._snapshot()
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    path = os.path.abspath(base + ".pickle")
    with open(path, "wb") as fh:
        pickle.dump(snapshot, fh)
    views: Dict[str, Optional[str]] = {}
    unavailable: Dict[str, str] = {}
    viz = viz_backend() if html else None
    for view in HTML_VIEWS if html else ():
        render = getattr(viz, view, None)
        if render is None:
            unavailable[f"html.{view}"] = f"torch.cuda._memory_viz has no {view} in this torch"
            continue
        try:
            text = render(snapshot)
            views[view] = os.path.abspath(f"{base}.{view}.html")
            with open(views[view], "w", encoding="utf-8") as fh:
                fh.write(text)
        except Exception as err:  # noqa: BLE001 - the pickle is written; a view is extra
            views.pop(view, None)
            unavailable[f"html.{view}"] = f"{type(err).__name__}: {err}"
    return {"path": path, "html": views, **totals(snapshot), "top_allocations": top_allocations(snapshot, top_k),
            "failed_request": failed_request(snapshot), "unavailable": unavailable}


def is_out_of_memory(exception: BaseException) -> bool:
    """torch's OutOfMemoryError, or a RuntimeError saying CUDA ran out of memory (older torch, wrapped errors)."""
    try:
        import torch

        if isinstance(exception, torch.cuda.OutOfMemoryError):
            return True
    except Exception:  # noqa: BLE001
        pass
    return isinstance(exception, RuntimeError) and "out of memory" in str(exception).lower()
