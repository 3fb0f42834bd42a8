"""The house by layers: imports only run downward, and no module imports itself back.

``exporter/`` is six folders, bottom to top: ``core`` (model, field declarations, units,
labels, config, file-system readers), ``collect`` (backends, kernel parsers, Kubernetes,
the hub, merge, energy split, health), ``output`` (exposition, dcgm names, OTLP, docs),
``serve`` (HTTP server, live page, history), ``client`` (``top``, the daemon's HTTP
client) and ``app`` (command line, flags, daemon, reload). A module may import its own
layer and the layers below it. Every import counts: at module level, inside a function
(a lazy import is still a dependency) and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exporter"
LAYERS = ("core", "collect", "output", "serve", "client", "app")
GENERATED = "proto"  # exporter/collect/kubernetes/proto: protoc's output


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if GENERATED in path.relative_to(PACKAGE).parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imported(path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module of ours) for every import in the file, resolved to the deepest
    module that exists (``from a.b import c`` is ``a.b.c`` when that is a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names] or [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield node.lineno, name


def layer(module: str) -> int:
    """The layer's rank; the package root (``__version__``) is below everything and
    ``__main__`` above."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] == "__main__":
        return len(LAYERS)
    assert parts[1] in LAYERS, f"{module}: not in a layer folder"
    return LAYERS.index(parts[1])


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for _, m in imported(path, known) if m != name}
            for name, path in known.items()}


def test_every_module_is_in_a_layer() -> None:
    for name in modules():
        layer(name)
    top = {p.name for p in PACKAGE.iterdir() if not p.name.startswith("__pycache__")}
    assert top == {"__init__.py", "__main__.py", *LAYERS}


@pytest.mark.slow
def test_imports_only_run_downward() -> None:
    known = modules()
    upward = [f"{name} ({path.relative_to(ROOT)}:{line}) imports {target}"
              for name, path in known.items()
              for line, target in imported(path, known)
              if layer(target) > layer(name)]
    assert upward == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
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


@pytest.mark.slow
def test_no_import_circle() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(("edges", "expected"), [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_circle_finder_finds_circles(edges: dict[str, set[str]],
                                         expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_the_reader_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from exporter.app import cli\n"
                      "def f():\n    import exporter.serve.server\n")
    known = modules()
    assert {m for _, m in imported(source, known)} == {
        "exporter.app.cli", "exporter.serve.server"}
