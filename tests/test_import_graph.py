"""The project's own modules (pipeline, models, kernels, runners) import each other without a cycle.

The graph is read from the source with `ast`, not by importing anything: every `import X` and
`from X import y` of a project module counts, wherever it stands (module level, inside a function,
under `if TYPE_CHECKING:`), since a function-level import only hides a cycle until that function runs,
and a type-only one is still a dependency in the wrong direction. `from pipeline.io import sinks` is an
edge to pipeline.io.sinks; `from pipeline.io.sinks import X` an edge to pipeline.io.sinks.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "models", "kernels", "runners")

Edges = dict[str, dict[str, str]]  # module -> {imported module: "file:line" of the first import}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _project_module(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to: itself, or its nearest enclosing project module."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> dict[str, str]:
    """The project modules `module` imports anywhere in its file, each with where it first does."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..models import y
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            # `from pipeline.io import sinks` names a submodule; `from pipeline.io.sinks import X` a name in one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            target = _project_module(name, modules)
            if target and target != module:
                found.setdefault(target, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def import_graph(root: Path = ROOT) -> Edges:
    modules = project_modules(root)
    return {module: imported_modules(module, path, modules) for module, path in modules.items()}


def find_cycle(graph: Edges) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, {}))))
    return None


def describe(cycle: list[str], graph: Edges) -> str:
    return "\n".join(f"  {a} -> {b}   ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_project_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, (
        "import cycle among the project's modules:\n" + describe(cycle, graph)
        + "\nbreak it by moving the function to the module that owns it, or a pure helper down into a lower module"
    )


def test_the_graph_sees_function_level_type_only_and_from_package_imports():
    """Guards the scanner itself: a scanner that missed these kinds of import would pass the test above vacuously."""
    graph = import_graph()
    assert len(graph) > 40 and all(p in graph for p in PACKAGES)
    assert "pipeline.io.sinks" in graph["pipeline.runs.publish"]  # from pipeline.io import sinks (module level)
    assert "pipeline.runs.report" in graph["pipeline.runs.publish"]  # from pipeline.runs import history, report (in a function)
    assert "pipeline.options" in graph["pipeline.runs.summary"]  # under `if TYPE_CHECKING:`
    assert "pipeline.process_setup" in graph["pipeline.validate"]  # from pipeline.process_setup import ... (in a function)


def test_find_cycle_names_the_cycle_and_where_each_import_is():
    graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:2"}, "c": {"a": "c.py:3"}, "d": {"a": "d.py:4"}}
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert describe(cycle, graph) == "  a -> b   (a.py:1)\n  b -> c   (b.py:2)\n  c -> a   (c.py:3)"
    assert find_cycle({"a": {"b": "a.py:1"}, "b": {}, "c": {"a": "c.py:1", "b": "c.py:2"}}) is None
