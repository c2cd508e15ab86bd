"""No module of flowwarden imports itself back through others: not at module level, not inside a
function, not under TYPE_CHECKING. A cycle means two modules that cannot be read apart."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "flowwarden"


def import_graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in modules else known(node.module)
                    if target is not None and target != name:
                        edges.add(target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = known(alias.name)
                    if target is not None and target != name:
                        edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_flowwarden_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_check_finds_a_cycle() -> None:
    graph = import_graph()
    graph["flowwarden.events"].add("flowwarden.runtime.stream")  # as a careless import would
    assert any("flowwarden.events" in cycle for cycle in cycles(graph))
