"""The package's layers import downward (docs/architecture.md, "Layers").

Every module of ``graph_autofusion`` is parsed with ``ast``; every import of the package,
at module level and inside functions, is an edge between two parts (a subpackage, or a
top-level module). The test fails on

- an import from a lower layer into a higher one (:data:`LAYERS`, bottom first);
- a cycle between parts (two parts of one layer importing each other);
- an import of another module's private (``_name``) name;
- an import inside a function of a package module that does not (at module level, through
  its own imports) load an optional heavy dependency (:data:`HEAVY`): such an import is only
  there to break a cycle or to put off a cost, and it hides the dependency.

Each remaining exception is listed below with its reason; an exception that no longer
occurs fails the test too, so the lists only shrink.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "graph_autofusion"
PKG = "graph_autofusion"

#: the layers, bottom first; a part imports only parts of its own layer or below
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "defaults",
        "env",
        "files",
        "reasons",
        "yaml_util",
        "cli_args",
        "progress",
        "renderers",
    ),
    ("ir", "catalog"),
    ("runtime.exec",),  # the IR's executor on torch (runtime/torch_*, interpreter, timing)
    ("frontend", "patterns"),
    ("cost", "samples"),  # sample inputs: the planner prices and safe mode checks on them
    ("planner",),
    ("codegen",),
    ("runtime",),
    ("verify",),
    ("report",),
    ("options",),
    ("pipeline",),
    ("testing",),  # the test-model zoo and fuzzers: drive the pipeline, used by tests and demo
    (
        "api",
        "api_results",
        "cli",
        "cli_fuse",
        "cli_analyze",
        "kernel_profile",
        "torch_compile",
        "torch_decode",
        "torch_decode_handoff",
        "torch_module",
        "torch_ort",
        "torch_outputs",
        "torch_recompiles",
        "demo",
        "__main__",
        "__init__",
    ),
)

#: modules that form a part of their own inside a subpackage: runtime's torch executor of
#: the IR's operators, which the frontend (aten conversion), the cost model (meta shapes)
#: and codegen (type inference) run, sits under them; runtime's kernel and session runners
#: sit above codegen
PART_OF_MODULE = {
    f"{PKG}.report.progress": "progress",  # the progress line on stderr: standard library only
    **{
        f"{PKG}.runtime.{m}": "runtime.exec"
        for m in (
            "torch_ops",
            "torch_ops_aten",
            "torch_ops_nn",
            "torch_ops_tensor",
            "torch_runtime",
            "interpreter",
            "timing",
            "ort_core",  # how a session is made (the calibration below codegen opens them)
            "denormals",  # the calling thread's flush-to-zero bits around a session's run
        )
    },
}

#: optional dependencies whose import costs seconds or may be missing: an import inside a
#: function of a package module that loads one of them at module level is allowed
HEAVY = frozenset(
    {"torch", "onnx", "onnxruntime", "openvino", "transformers", "onnxscript", "scipy"}
)

#: (importing part, imported part): an upward or cyclic edge still in the code, and why
EDGE_EXCEPTIONS: dict[tuple[str, str], str] = {}

#: (module, imported module, name): a private name still imported, and why
PRIVATE_EXCEPTIONS: dict[tuple[str, str, str], str] = {}

#: module -> why its imports of light package modules sit inside functions
_ENTRY = (
    "an entry point imports the stages a command or call runs when it runs: with them at "
    "module level `import graph_autofusion` (and `graph-autofusion --help`) took 0.33-0.39 s "
    "instead of 0.21-0.25 s on the 2-core AVX2 machine (2026-12-02)"
)
FUNCTION_IMPORT_EXCEPTIONS: dict[str, str] = {
    f"{PKG}.api": _ENTRY,
    f"{PKG}.cli": _ENTRY,
    f"{PKG}.api_results": _ENTRY,
    f"{PKG}.cli_fuse": _ENTRY,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}


def _is_package(module: str) -> bool:
    return (ROOT.parent / module.replace(".", "/") / "__init__.py").exists()


def _target(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Import:
    """One imported package module (and the name taken from it, if any)."""

    def __init__(self, src: str, target: str, name: str | None, line: int, in_function: bool):
        self.src, self.target, self.name, self.line = src, target, name, line
        self.in_function = in_function

    def __repr__(self) -> str:
        what = f"{self.target}.{self.name}" if self.name else self.target
        return (
            f"{self.src}:{self.line} imports {what}{' (in a function)' if self.in_function else ''}"
        )


@functools.cache
def _imports() -> tuple[list[Import], dict[str, set[str]]]:
    """Every import of the package, and every module's module-level external imports."""
    modules = _modules()
    out: list[Import] = []
    external: dict[str, set[str]] = defaultdict(set)

    def walk(src: str, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name == PKG or a.name.startswith(PKG + "."):
                        out.append(Import(src, a.name, None, child.lineno, in_function))
                    elif not in_function:
                        external[src].add(a.name.split(".")[0])
            elif isinstance(child, ast.ImportFrom):
                target = _target(src, child)
                if target == PKG or target.startswith(PKG + "."):
                    for a in child.names:
                        sub = f"{target}.{a.name}"
                        if sub in modules:  # from package import module
                            out.append(Import(src, sub, None, child.lineno, in_function))
                        else:
                            out.append(Import(src, target, a.name, child.lineno, in_function))
                elif not in_function:
                    external[src].add(target.split(".")[0])
            walk(src, child, inner)

    for name, tree in modules.items():
        walk(name, tree, False)
    return out, external


def part(module: str) -> str:
    if module in PART_OF_MODULE:
        return PART_OF_MODULE[module]
    rest = module.split(".")[1:]
    return rest[0] if rest else "__init__"


def _layer_of() -> dict[str, int]:
    return {p: i for i, layer in enumerate(LAYERS) for p in layer}


@functools.cache
def _module_level_targets() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for i in _imports()[0]:
        if not i.in_function:
            out[i.src].add(i.target)
    return out


@functools.cache
def _heavy(module: str) -> frozenset[str]:
    """The heavy dependencies ``module`` loads when imported (module-level imports, its own
    and those of the package modules and packages it imports)."""
    _, external = _imports()
    targets = _module_level_targets()
    seen: set[str] = set()
    todo = [module]
    found: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        found |= external.get(m, set()) & HEAVY
        parents = [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
        todo.extend(p for p in parents if p in _modules())
        todo.extend(targets.get(m, ()))
    return frozenset(found)


def test_every_part_has_a_layer():
    layers = _layer_of()
    unknown = sorted({part(m) for m in _modules()} - set(layers))
    assert not unknown, f"parts without a layer in LAYERS (place them): {unknown}"


def _edge_violations() -> dict[tuple[str, str], list[Import]]:
    layers = _layer_of()
    bad: dict[tuple[str, str], list[Import]] = defaultdict(list)
    graph: dict[str, set[str]] = defaultdict(set)
    imports, _ = _imports()
    for i in imports:
        a, b = part(i.src), part(i.target)
        if a == b:
            continue
        graph[a].add(b)
        if layers.get(b, -1) > layers.get(a, -1):
            bad[(a, b)].append(i)
    for a, targets in graph.items():  # same-layer parts importing each other
        for b in targets:
            if a in graph.get(b, ()) and layers.get(a) == layers.get(b):
                bad[(a, b)].extend(i for i in imports if (part(i.src), part(i.target)) == (a, b))
    return bad


def test_imports_go_down_the_layers():
    bad = _edge_violations()
    new = {k: v for k, v in bad.items() if k not in EDGE_EXCEPTIONS}
    assert not new, "upward or cyclic imports (docs/architecture.md, Layers):\n" + "\n".join(
        f"{a} -> {b}: {v[:3]}" for (a, b), v in sorted(new.items())
    )


def test_no_stale_edge_exception():
    stale = sorted(set(EDGE_EXCEPTIONS) - set(_edge_violations()))
    assert not stale, f"fixed: remove from EDGE_EXCEPTIONS: {stale}"


def _private_imports() -> dict[tuple[str, str, str], Import]:
    imports, _ = _imports()
    return {
        (i.src, i.target, i.name): i
        for i in imports
        if i.name and i.name.startswith("_") and not i.name.startswith("__")
    }


def test_no_private_names_imported():
    found = _private_imports()
    new = [i for k, i in sorted(found.items()) if k not in PRIVATE_EXCEPTIONS]
    assert not new, "imports of another module's private name:\n" + "\n".join(map(repr, new))
    stale = sorted(set(PRIVATE_EXCEPTIONS) - set(found))
    assert not stale, f"fixed: remove from PRIVATE_EXCEPTIONS: {stale}"


def _light_function_imports() -> dict[str, list[Import]]:
    imports, _ = _imports()
    out: dict[str, list[Import]] = defaultdict(list)
    for i in imports:
        if i.in_function and not _heavy(i.target):
            out[i.src].append(i)
    return out


def test_function_level_imports_only_for_heavy_dependencies():
    found = _light_function_imports()
    new = {m: v for m, v in found.items() if m not in FUNCTION_IMPORT_EXCEPTIONS}
    assert not new, (
        "imports inside functions of package modules that load no heavy dependency (move "
        "them to module level, or fix the layering that forced them):\n"
        + "\n".join(f"{m}: {v[:4]}" for m, v in sorted(new.items()))
    )
    stale = sorted(set(FUNCTION_IMPORT_EXCEPTIONS) - set(found))
    assert not stale, f"fixed: remove from FUNCTION_IMPORT_EXCEPTIONS: {stale}"


@pytest.mark.parametrize(
    "module, heavy", [(f"{PKG}.runtime.torch_ops", "torch"), (f"{PKG}.ir.core", None)]
)
def test_heavy_dependency_detection(module, heavy):
    """The test's own reading: torch_ops loads torch at import, ir.core loads none."""
    assert (heavy in _heavy(module)) if heavy else not _heavy(module)
