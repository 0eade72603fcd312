"""The shape of the code (issue 36): no import cycles between modules, no import running up the
layers of docs/architecture.md, and no module too long to read.

The graph is read from the source with ``ast``, nothing is imported: every ``import`` and ``from ...
import`` of a ``kistexp`` or ``fake_authorities`` module, relative ones resolved, wherever it stands (at
module level, under ``if TYPE_CHECKING:``, inside a function). ``from package import name`` is an arrow
to the submodule ``package.name`` when there is one, else to the package. Importing ``a.b.c`` runs
``a/__init__.py`` and ``a/b/__init__.py`` too, but those implicit arrows are left out: a package that
re-exports its submodules would otherwise be in a cycle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("kistexp", "fake_authorities")
MAX_LINES = 800

# --- the layers ---------------------------------------------------------------------------------------
# docs/architecture.md: data flows plan -> population / simulator / collectors -> engine -> judge ->
# report, and lower layers never import higher ones. Each module takes the layer of the longest prefix
# below that names it; a module may import its own layer and those below, never one above. A module
# no prefix names fails the test: place it when it is added.
LAYERS: dict[str, int] = {
    # 0: the foundation, knowing nothing of experiments
    "kistexp": 0,  # kistexp/__init__.py: the version
    "kistexp.errors": 0,
    "kistexp.asciinum": 0,
    "kistexp.textsafe": 0,
    "kistexp.safeio": 0,
    "kistexp.clock": 0,
    "kistexp.durations": 0,
    "kistexp.output": 0,
    "kistexp.params": 0,  # the parameter catalogue: knows no plan
    "kistexp.stats": 0,
    "kistexp.store": 0,
    "kistexp.expdir": 0,
    # 1-2: tor's directory protocol, then the HTTP client for it (dirauth does no HTTP)
    "kistexp.dirauth": 1,
    "kistexp.directory": 2,
    # 3: the metric catalogue and collectors, the fake authorities (never the rollout engine)
    "kistexp.metrics": 3,
    "kistexp.consensus_fetch": 3,
    "fake_authorities": 3,
    # 4-5: the simulator and the local tor network, then the population over the simulator
    "kistexp.sim": 4,
    "kistexp.localnet": 4,
    "kistexp.population": 5,
    "kistexp.anonymity": 5,  # attack measures on simulator traces (the run period from population.kernels)
    # 6-7: the plan as data (schema, loading, timeline), then the judge that reads plans' criteria
    "kistexp.plan": 6,
    "kistexp.judge": 7,
    # 8: what runs things: the rollout engine, sweeps, fidelity runs; the plan linter, which takes the
    # engine's cadence, washout and sequential method as knowledge (kistexp.rollout.spec, .judging)
    "kistexp.rollout": 8,
    "kistexp.sweep": 8,
    "kistexp.fidelity": 8,
    "kistexp.plan.lint": 8,
    "kistexp.plan.lint_power": 8,
    # 9: the report reads experiments; 10: the command line over everything
    "kistexp.report": 9,
    "kistexp.commands": 10,
    "kistexp.cli": 10,
    "kistexp.__main__": 10,
}

# What a part must not import even from its own layer or below (docs/architecture.md, "does not").
MUST_NOT_IMPORT: dict[str, tuple[str, ...]] = {
    "kistexp.stats": ("kistexp", "fake_authorities"),  # statistics with no kistexp imports
    "kistexp.params": ("kistexp.plan",),  # the catalogue knows no plan
    "kistexp.dirauth": ("kistexp.directory",),  # does no HTTP
    "kistexp.sweep": ("kistexp.sim",),  # the simulator only through kistexp.population
}


# --- the graph ----------------------------------------------------------------------------------------


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (source file, is a package) for every module of PACKAGES."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def _ours(name: str) -> bool:
    return name.split(".", 1)[0] in PACKAGES


def _module_of(name: str) -> str | None:
    """The module ``name`` is, or is in (``kistexp.plan.model.Plan`` -> ``kistexp.plan.model``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, tree: ast.AST, is_package: bool) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import of one of PACKAGES' modules in ``tree``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name) and (target := _module_of(alias.name)):
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if not _ours(source):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in MODULES else _module_of(source)
                if target:
                    yield target, node.lineno


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}; a module's imports of itself left out."""
    graph: dict[str, dict[str, int]] = {}
    for module, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        arrows: dict[str, int] = {}
        for target, line in imports_of(module, tree, is_package):
            if target != module:
                arrows[target] = min(arrows.get(target, line), line)
        graph[module] = arrows
    return graph


GRAPH = _graph()


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def _where(module: str, line: int) -> str:
    return f"{MODULES[module][0].relative_to(REPO)}:{line}"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    best = max((p for p in LAYERS if _under(module, p)), key=len, default=None)
    return None if best is None else LAYERS[best]


# --- the checks ---------------------------------------------------------------------------------------


def test_the_graph_is_read():
    """The walk sees what it should: relative, function-level and TYPE_CHECKING imports alike."""
    assert len(MODULES) > 100 and "kistexp.plan.model" in MODULES and "fake_authorities.network" in MODULES
    tree = ast.parse("from . import model\nfrom ..errors import PlanError\n"
                     "def f():\n    import kistexp.sim.tcp\n    from kistexp.metrics import catalogue\n"
                     "if TYPE_CHECKING:\n    from fake_authorities.network import FakeAuthorityNetwork\n")
    assert sorted(imports_of("kistexp.plan.loader", tree, False)) == [
        ("fake_authorities.network", 7), ("kistexp.errors", 2), ("kistexp.metrics.catalogue", 5),
        ("kistexp.plan.model", 1), ("kistexp.sim.tcp", 4)]
    assert sorted(imports_of("kistexp.plan", ast.parse("from . import model\nfrom .loader import x"), True)) \
        == [("kistexp.plan.loader", 2), ("kistexp.plan.model", 1)]
    cyclic = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert sorted(map(sorted, strongly_connected(cyclic))) == [["a", "b", "c"], ["d"]]


def test_no_import_cycles():
    cycles = []
    for component in strongly_connected(GRAPH):
        if len(component) > 1:
            members = set(component)
            arrows = [f"    {m} -> {t} ({_where(m, line)})" for m in component
                      for t, line in sorted(GRAPH[m].items()) if t in members]
            cycles.append(f"  {', '.join(component)}:\n" + "\n".join(arrows))
    assert not cycles, "modules importing each other, directly or round a circle:\n" + "\n".join(cycles)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {', '.join(unplaced)}"


def test_no_import_runs_up_the_layers():
    upward = []
    for module, arrows in sorted(GRAPH.items()):
        mine = layer_of(module)
        for target, line in sorted(arrows.items()):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"  {module} (layer {mine}) imports {target} (layer {theirs}) at "
                              f"{_where(module, line)}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


@pytest.mark.parametrize("part", sorted(MUST_NOT_IMPORT))
def test_what_a_part_must_not_import(part):
    found = [f"  {module} imports {target} at {_where(module, line)}"
             for module, arrows in sorted(GRAPH.items()) if _under(module, part)
             for target, line in sorted(arrows.items())
             if any(_under(target, p) for p in MUST_NOT_IMPORT[part]) and not _under(target, part)]
    assert not found, f"{part} must not import {', '.join(MUST_NOT_IMPORT[part])}:\n" + "\n".join(found)


def test_no_module_is_too_long():
    long = {str(path.relative_to(REPO)): n for path, _ in MODULES.values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: split them: " + ", ".join(
        f"{p} ({n})" for p, n in sorted(long.items()))
