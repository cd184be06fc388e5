"""Imports inside jaxnet/ run one way: no circles, and no layer reaches up into a higher one.

The graph is read from the source with ``ast`` (imports inside functions count too), so the test
needs no JAX and runs in well under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxnet"

#: From the bottom up: a module may import its own layer and the layers below it. The model
#: families stand on jaxnet.models.base alone; the config schema stands on the model registry;
#: the trainer on everything below it. The tokenizers stand on the errors alone, so the config
#: schema reads their choices. A module named nowhere here counts as an application (the top
#: layer but for the command line), like sample, sweep and bench.
LAYERS = [
    ("jaxnet.errors", "jaxnet._startup", "jaxnet._lazy", "jaxnet.catalog", "jaxnet.tokenizers"),
    ("jaxnet.models",),
    ("jaxnet.config",),
    (
        "jaxnet.data",
        "jaxnet.optim",
        "jaxnet.parallel",
        "jaxnet.tasks",
        "jaxnet.preference",  # the preference objectives (tasks over pairs), which a preference corpus names
        "jaxnet.blockwise",  # the tasks' cross-entropy from features and output layer
        "jaxnet.observe",
        "jaxnet.checkpoint",
        "jaxnet.xla_options",  # the compiler options of the steps: JAX alone
    ),
    ("jaxnet.train",),
    None,  # applications: jaxnet.sample, jaxnet.sweep, jaxnet.bench, jaxnet.study, ...
    ("jaxnet.cli", "jaxnet.__main__", "jaxnet"),
]


def module_names(package: Path) -> dict[str, Path]:
    """Every module under ``package`` by dotted name (a package by its own name)."""
    names = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports. ``from P import name`` is an import of
    the module ``P.name`` where there is one, else of ``P``; a package's own ``__init__`` running
    before its submodules is not counted (every package does that)."""
    modules = module_names(package)

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets |= {owner(f"{base}.{alias.name}") for alias in node.names}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (the longest matching prefix wins)."""
    best, depth = LAYERS.index(None), 0
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes or ():
            matches = module == prefix or (prefix != "jaxnet" and module.startswith(prefix + "."))
            if matches and len(prefix) > depth:
                best, depth = i, len(prefix)
    return best


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_the_graph_sees_the_imports_it_must_see(graph):
    assert "jaxnet.train.actions" in graph["jaxnet.train.loop"]  # from jaxnet.train import actions as ...
    assert "jaxnet.models.base" in graph["jaxnet.config.schema"]  # from jaxnet.models import base as ...
    assert "jaxnet.models.base" in graph["jaxnet.models.cnn"]  # from jaxnet.models.base import ...
    assert "jaxnet.config" in graph["jaxnet.optim"]


def test_the_circle_finder_finds_a_circle_through_three_modules():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_of_jaxnet_imports_one_that_imports_it_back(graph):
    assert circles(graph) == []


def test_no_module_imports_from_a_higher_layer(graph):
    upward = [
        f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if layer(t) > layer(m)
    ]
    assert upward == []


def test_model_files_stand_on_the_model_base_alone(graph):
    models = {m: t for m, t in graph.items() if m.startswith("jaxnet.models")}
    assert set(models) >= {"jaxnet.models.base", "jaxnet.models.cnn", "jaxnet.models.lstm", "jaxnet.models.transformer"}
    # Beside the errors, the process facts that _startup reads before JAX starts (the threads XLA's
    # CPU client runs with, which the CPU attention's pieces follow): both import nothing of jaxnet.
    base = {"jaxnet.errors", "jaxnet._startup"}
    outside = {m: sorted(t for t in targets if not t.startswith("jaxnet.models") and t not in base)
               for m, targets in models.items()}  # fmt: skip
    assert {m: t for m, t in outside.items() if t} == {}
    assert graph["jaxnet.models.base"] <= {"jaxnet.errors"}


def test_the_layers_below_the_trainer_never_import_it(graph):
    below = [m for m in graph if layer(m) < layer("jaxnet.train")]
    assert "jaxnet.config.schema" in below and "jaxnet.data.text" in below
    reaching_up = {m: sorted(t for t in graph[m] if t.startswith(("jaxnet.train", "jaxnet.cli"))) for m in below}
    assert {m: t for m, t in reaching_up.items() if t} == {}
