"""The house's corridors: the import graph of decider's modules (every import, those inside
functions too) has no cycle, and the core (request types, prompts, plan, scoring, guard,
answers, api, catalog, config, errors, logs) imports none of the rooms built on it:
service/, http/, systemone/, bench/, commands/. One exception, by design: the in-process
API answers System One requests (Decider.decide_systemone imports decider.systemone)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"decider": ROOT / "decider", "decider.engines": ROOT / "engines",
            "decider.kernels": ROOT / "kernels"}
ROOMS = ("decider.service", "decider.http", "decider.systemone", "decider.bench",
         "decider.commands", "decider.evaluation")
OUTSIDE_THE_CORE = ("decider.client", "decider.__main__", "decider.v1", *ROOMS)
ALLOWED = {("decider.api", "decider.systemone.mapping")}


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the tree that `name` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name in a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def in_room(name: str, rooms) -> bool:
    return any(name == r or name.startswith(r + ".") for r in rooms)


def test_the_core_imports_no_room_built_on_it(graph):
    core = [m for m in graph if m.startswith("decider") and not in_room(m, OUTSIDE_THE_CORE)
            and not in_room(m, ("decider.engines", "decider.kernels"))]
    assert "decider.api" in core and "decider.questions.choice" in core
    forbidden = sorted((m, t) for m in core for t in graph[m]
                       if in_room(t, ROOMS) and (m, t) not in ALLOWED)
    assert forbidden == []


def test_the_engines_and_kernels_import_nothing_of_the_service_or_its_fronts(graph):
    low = [m for m in graph if in_room(m, ("decider.engines", "decider.kernels"))]
    assert sorted((m, t) for m in low for t in graph[m]
                  if in_room(t, (*ROOMS, "decider.api", "decider.plan", "decider.v1"))) == []


def test_no_cycle_of_imports(graph):
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []
