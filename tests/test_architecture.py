"""The seams between the layers: the import graph, who may name a template, the runtime's imports."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"prnn_tvm": "prnn_tvm", "schedules": "prnn_tvm.schedules", "cells": "prnn_tvm.cells"}


def _modules() -> dict:
    """Module name -> (path, is package) for every module of the project."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            name = ".".join([package, *(parts[:-1] if is_pkg else parts)])
            found[name] = (path, is_pkg)
    return found


MODULES = _modules()


def _imports(name: str) -> set:
    """Project modules ``name`` imports (anywhere in the file, lazy imports included)."""
    path, is_pkg = MODULES[name]
    out = _imported(path, name.split(".") if is_pkg else name.split(".")[:-1])
    # a module's own package is imported before it, whatever the module imports: not an edge
    return {m for m in out if m != name and not name.startswith(m + ".")}


def _imported(path: pathlib.Path, base: list) -> set:
    """Project modules the file at ``path`` imports (relative imports from package ``base``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        out |= {c for c in candidates if c in MODULES}
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def test_the_import_graph_has_no_cycles():
    """``prnn_tvm/__init__`` is the public facade (cells import ``Cell`` from it), so edges into it
    are not part of the layering; every other edge must point down."""
    graph = {n: {m for m in deps if m != "prnn_tvm"} for n, deps in GRAPH.items() if n != "prnn_tvm"}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for dep in graph[node]:
            if state.get(dep) == "open":
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(dep) :], dep]))
            if dep not in state:
                visit(dep, [*stack, dep])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])


# every module of schedules/ but the package (templates_for, by_name) and the contract is a template's internals
TEMPLATE_INTERNALS = {name for name in MODULES if name.startswith("prnn_tvm.schedules.")} - {
    "prnn_tvm.schedules.template"
}
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def test_the_template_internals_are_found_in_schedules():
    assert {
        "prnn_tvm.schedules.persistent_mma_config",
        "prnn_tvm.schedules.ranking",
        "prnn_tvm.schedules.persistent_backward",
        "prnn_tvm.schedules.cpu_reference",
    } <= TEMPLATE_INTERNALS
    assert len(TEMPLATE_INTERNALS) == len(list((ROOT / "schedules").glob("*.py"))) - 2 and SCRIPTS


def test_an_import_of_template_internals_is_seen(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text(
        "from prnn_tvm.schedules import persistent_mma_config as mc\n"
        "def later():\n    from prnn_tvm.schedules.ranking import parts\n"
    )
    assert _imported(script, []) & TEMPLATE_INTERNALS == {
        "prnn_tvm.schedules.persistent_mma_config",
        "prnn_tvm.schedules.ranking",
    }


def test_only_schedules_name_a_particular_template():
    """The compiler, tuner, records, the benchmark and its scripts reach templates through the contract
    (``schedules.templates_for`` / ``template_for`` / ``by_name`` and the ``Template`` protocol), never by
    importing one's modules."""
    for name, deps in GRAPH.items():
        if not name.startswith("prnn_tvm.schedules"):
            assert not deps & TEMPLATE_INTERNALS, f"{name} imports {deps & TEMPLATE_INTERNALS}"
    for script in SCRIPTS:
        deps = _imported(script, [])
        assert not deps & TEMPLATE_INTERNALS, f"bench/{script.name} imports {deps & TEMPLATE_INTERNALS}"


@pytest.mark.parametrize(
    "name",
    [
        "prnn_tvm.runtime.base",
        "prnn_tvm.runtime.binding",
        "prnn_tvm.runtime.buffers",
        "prnn_tvm.runtime.loading",
        "prnn_tvm.runtime.launcher",
        "prnn_tvm.runtime.l2",
        "prnn_tvm.runtime.session",
        "prnn_tvm.runtime.session_host",
        "prnn_tvm.runtime.session_native",
        "prnn_tvm.runtime.session_words",
    ],
)
def test_the_runtime_imports_no_compiler_module(name):
    """What ``prnn_tvm.load`` runs must work under TVM's runtime-only import."""
    allowed = {
        "prnn_tvm.errors",
        "prnn_tvm.files",
        "prnn_tvm.signature",
        "prnn_tvm.target",
        "prnn_tvm.dtypes",
        "prnn_tvm.runtime",
        "prnn_tvm.runtime.base",
        "prnn_tvm.runtime.binding",
        "prnn_tvm.runtime.buffers",
        "prnn_tvm.runtime.loading",
        "prnn_tvm.runtime.launcher",
        "prnn_tvm.runtime.session",
        "prnn_tvm.runtime.session_host",
        "prnn_tvm.runtime.session_native",
        "prnn_tvm.runtime.session_words",
        "prnn_tvm.runtime.limits",
        "prnn_tvm.cache.settings",  # these two import only the standard library
        "prnn_tvm.cache.store",
        "prnn_tvm.runtime.l2",  # the L2 window (ctypes and the CUDA runtime TVM loaded, as peers)
        "prnn_tvm.runtime.peers",
    }
    seen, todo = set(), [name]
    while todo:
        for dep in GRAPH[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    assert seen <= allowed, f"{name} reaches {sorted(seen - allowed)}"
