"""The package's layout holds: only the pytest glue imports pytest (or the glue), no two modules import
each other, directly or through others (imports inside functions count, ``TYPE_CHECKING`` ones do not),
and the package itself and its hook specs import nothing else of the package when they are imported."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_cachecheck"
GLUE = {"plugin", "reporter", "_collect", "_items", "_api", "hookspecs"}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts).replace(".__init__", "")


def _imports(path: Path) -> Set[str]:
    """The package modules and top-level packages a module imports at run time."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for child in node.body for n in ast.walk(child)}
    base = _name(path).split(".")[:-1] if path.name != "__init__.py" else _name(path).split(".")
    found: Set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.add((node.module or "").split(".")[0])
                continue
            parts = base[:len(base) - (node.level - 1)] if node.level > 1 else list(base)
            mod = ".".join(p for p in parts + (node.module or "").split(".") if p)
            if node.module:
                found.add("pkg:" + mod)
            else:
                found |= {"pkg:" + ".".join(p for p in parts + [a.name] if p) for a in node.names}
    return found


def _graph() -> Dict[str, Set[str]]:
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = {d[4:] for d in _imports(path) if d.startswith("pkg:")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_only_the_glue_imports_pytest():
    offenders = sorted(_name(p) for p in PACKAGE.rglob("*.py")
                       if _name(p) not in GLUE and "pytest" in _imports(p))
    assert offenders == []
    graph = _graph()
    leaning = sorted(m for m, deps in graph.items() if m not in GLUE and deps & GLUE)
    assert leaning == []


def test_the_package_and_the_hookspecs_import_nothing_of_the_package():
    # the package's names are imported on first use (its __getattr__), the hook specs only name types
    assert _imports(PACKAGE / "__init__.py") <= {"__future__", "importlib", "typing"}
    assert _imports(PACKAGE / "hookspecs.py") <= {"__future__", "typing", "pytest"}


def test_no_import_cycle():
    graph = _graph()
    assert "session" in graph["plugin"] and "model" in graph["run"]  # the graph sees the imports
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: List[List[str]] = []

    def visit(node: str, trail: List[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(trail[trail.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, trail + [dep])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == []


def test_the_words_of_kinds_and_the_numbers_are_leaves():
    # every layer names kinds of item and counts them: those modules import nothing of the package
    graph = _graph()
    assert {m: graph[m] for m in ("kinds", "stats", "text", "errors")} == \
        {"kinds": set(), "stats": set(), "text": set(), "errors": set()}
    assert "kinds" in graph["run"] and "kinds" in graph["reporter"] and "kinds" in graph["_collect"]
