"""The house by layers: imports only run downward, and no module imports itself back.

``exporter/`` is eight folders, bottom to top: ``core`` (model, field declarations,
units, labels, config, file-system readers), ``sources`` (vendor backends, kernel
parsers, discovery), ``attribution`` (Kubernetes, Slurm), ``pipeline`` (hub, merge,
energy split, health, the backend table), ``output`` (exposition, dcgm names, OTLP),
``serve`` (HTTP server, live page, history), ``client`` (``top`` and the fleet view, on
their terminal) and ``app`` (command line, flags, daemon, reload). A module may import
its own layer and the layers below it; inside ``client`` the same holds for ``fetch`` and
``terminal`` < ``top`` < ``fleet``. Every import counts: at module level, inside a
function (a lazy import is still a dependency) and under ``TYPE_CHECKING``.

The shipped package imports nothing of the checkout (``tests``, ``tools``, ``bench``) and
no third-party module that pyproject.toml does not declare.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exporter"
LAYERS = ("core", "sources", "attribution", "pipeline", "output", "serve", "client", "app")
# Inside client: the shared pieces, then the one-daemon view, then the fleet view (whose
# drill-down draws with the one-daemon panels).
CLIENT = ("fetch", "terminal", "top", "fleet")
GENERATED = "proto"  # exporter/attribution/kubernetes/proto: protoc's output


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


def client_rank(module: str) -> int:
    parts = module.split(".")
    if parts[:2] != ["exporter", "client"] or len(parts) == 2:
        return -1
    return CLIENT.index(parts[2]) if parts[2] in CLIENT else -1


def test_client_views_import_downward() -> None:
    """The terminal and fetch know neither view; the one-daemon view knows no fleet."""
    known = modules()
    upward = [f"{name} ({path.relative_to(ROOT)}:{line}) imports {target}"
              for name, path in known.items() if client_rank(name) >= 0
              for line, target in imported(path, known)
              if client_rank(target) > client_rank(name)
              and CLIENT[client_rank(target)] != CLIENT[client_rank(name)]]
    assert upward == []
    assert {p.name for p in (PACKAGE / "client").iterdir()
            if not p.name.startswith("__")} == {"fetch.py", "terminal.py", "top", "fleet"}


def test_sources_import_only_core() -> None:
    """A vendor source knows nothing of the pipeline, attribution or output."""
    known = modules()
    wrong = [f"{name}:{line} imports {target}"
             for name, path in known.items() if name.startswith("exporter.sources")
             for line, target in imported(path, known)
             if layer(target) not in (-1, LAYERS.index("core"), LAYERS.index("sources"))]
    assert wrong == []


def _declared() -> set[str]:
    """The import names of pyproject.toml's dependencies and extras."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        if extra != "test":
            wanted += reqs
    dists = {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in wanted}
    return {IMPORT_NAMES.get(d, d.replace("-", "_")) for d in dists}


# A distribution whose import name is not its own (pyproject name -> top-level module).
IMPORT_NAMES = {"prometheus-client": "prometheus_client", "nvidia-ml-py": "pynvml",
                "pyyaml": "yaml", "grpcio": "grpc", "protobuf": "google",
                "opentelemetry-sdk": "opentelemetry",
                "opentelemetry-exporter-otlp-proto-http": "opentelemetry"}


def third_party(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import that is not ours."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top != "exporter" and top not in sys.stdlib_module_names:
                yield node.lineno, top


def test_the_package_imports_only_what_it_declares() -> None:
    """No ``tests``, ``tools`` or ``bench`` (the checkout is not installed), and no
    third-party module pyproject.toml does not declare (a user's install would lack it)."""
    declared = _declared()
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {top}"
             for path in PACKAGE.rglob("*.py") if GENERATED not in path.parts
             for line, top in third_party(path) if top not in declared]
    assert wrong == []
    assert not any("sys.path" in p.read_text() for p in PACKAGE.rglob("*.py"))


def test_the_declared_check_catches_a_test_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import yaml\nfrom tests import coverage_matrix\nimport tools.metricsdoc\n")
    assert [top for _, top in third_party(source) if top not in _declared()] == [
        "tests", "tools"]


def test_pyproject_lists_every_package_and_nothing_else() -> None:
    """The wheel's package list (pyproject.toml lists it: discovery would walk the fixture
    trees' symlink cycles) is exactly the folders of exporter/ with an __init__.py."""
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert sorted(listed) == sorted(found)
