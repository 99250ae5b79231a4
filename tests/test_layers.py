"""The layout: packages by concept, layers that only point down, no import circle.

The layers are pyproject.toml's import-linter contract; the circles are found here, module
by module, counting every import (those inside functions too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("agentrun", "debugger", include_external_packages=False)
    assert circles(graph) == []


def test_a_circle_is_found_and_named():
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    assert circles(graph) == []
    graph.add_import(importer="a.z", imported="a.x")
    assert circles(graph) == [["a.x", "a.y", "a.z"]]


def lint_imports() -> subprocess.CompletedProcess:
    command = [Path(sys.executable).parent / "lint-imports", "--config", "pyproject.toml"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_layers_point_down_and_the_runtime_never_imports_the_dashboard():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    layers = (ROOT / "pyproject.toml").read_text().split("[[tool.importlinter.contracts]]")[1]
    assert layers.index('"debugger",') < layers.index('"agentrun.api')


def packages(top: str) -> list[Path]:
    return sorted(
        p.parent
        for p in (ROOT / top).rglob("__init__.py")
        if "migrations" not in p.parts and "__pycache__" not in p.parts
    )


def test_every_package_says_what_lives_there():
    silent = [
        str(p.relative_to(ROOT))
        for top in ("agentrun", "debugger")
        for p in packages(top)
        if len(ast.get_docstring(ast.parse((p / "__init__.py").read_text())) or "") < 60
    ]
    assert silent == []


def test_the_runtime_keeps_few_modules_beside_its_packages():
    modules = sorted(p.name for p in (ROOT / "agentrun").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 12, modules
