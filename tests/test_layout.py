"""The package's layout holds: no import circle between its modules (imports inside functions and under
TYPE_CHECKING count too), callbacks that share code only through ``callbacks/core``, and layers that import only
downwards (``measure`` and ``summary`` know nothing of the callbacks, the bench or the CLI)."""

import ast
import os
from typing import Dict, List, Set

import lightning_perf

ROOT = os.path.dirname(os.path.abspath(lightning_perf.__file__))
#: PerfSuite drives the four default callbacks as one: it imports them by design (docs/perf_suite.md).
COMPOSES = {"perf_suite": {"iteration_timer", "section_profiler", "vram_monitor", "eval_no_grad_guard"}}


def _modules() -> Dict[str, str]:
    """Dotted name -> file, for every module of the package (a package is its ``__init__``)."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(folder, name), os.path.dirname(ROOT))[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = os.path.join(folder, name)
    return found


def _graph() -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports anywhere in its file (``from a.b import c`` is ``a.b.c`` where that
    is a module, else ``a.b``)."""
    modules = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        targets: List[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                            for alias in node.names]
        edges = set()
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_module_graph_has_no_import_circle():
    graph = _graph()
    assert "lightning_perf.callbacks.core.base" in graph and "lightning_perf.measure.timing.clock" in graph
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _callback_package(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["lightning_perf", "callbacks"] else ""


def test_callbacks_share_code_only_through_core():
    crossings = []
    for module, edges in _graph().items():
        own = _callback_package(module)
        if not own:
            continue
        for target in edges:
            other = _callback_package(target)
            if other and other != own and other != "core" and other not in COMPOSES.get(own, ()):
                crossings.append(f"{module} -> {target}")
            if own == "core" and other and other != "core":
                crossings.append(f"{module} -> {target} (core is below every callback)")
    assert crossings == []


def test_layers_import_only_downwards():
    above = ("lightning_perf.callbacks", "lightning_perf.bench", "lightning_perf._attach", "lightning_perf.cli")
    upward = [f"{module} -> {target}" for module, edges in _graph().items()
              if module.startswith(("lightning_perf.measure", "lightning_perf.summary"))
              for target in edges if target.startswith(above)]
    assert upward == []
