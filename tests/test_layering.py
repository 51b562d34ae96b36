"""The import rules of docs/architecture.md ("Who may import whom"), read from the code.

Every module's imports are read with ``ast`` (those inside functions too, since a lazy import is
still a dependency), resolved to the project's modules, and checked: no circle at any depth, the
packages import only the layers the table allows, and no target package imports another's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tile", "ref_interp", "stripe", "backends")
# the framework bridges (tile.torch with its CUDA memory tile.torch_cuda and its fast lane
# tile.torch_lane and hot path tile.torch_hot, tile.jax, and tile.bridge, which they share) sit on
# tile.api
USER_API = {
    "tile", "tile.api", "tile.cli", "tile.__main__", "tile.bridge", "tile.torch", "tile.torch_cuda",
    "tile.torch_lane", "tile.torch_hot", "tile.jax",
}
ALLOWED = {  # a package's modules may import these packages (besides their own)
    "tile": {"tile"},
    "ref_interp": {"tile", "stripe", "ref_interp"},
    "stripe": {"tile", "stripe"},
    "backends": {"tile", "stripe", "backends"},
}
# Allowed by name, with the reason (docs/architecture.md says the same): PlaidML is a peer
# implementation, not a target of ours; which of its answers are a documented difference is judged
# against the oracle's; the ONNX backend's fast lane, like tile.torch_lane, runs a compiled
# program's kernels on raw addresses (backends.lane), a bridge's job on top of tile.api
EXCEPTIONS = {("backends.plaidml.device", "ref_interp"), ("tile.onnx.lane", "backends.lane")}
# the targets' packages; backends.clike is the C-like emission that C dialects (OpenCL) build on,
# so opencl may import it, and so may cuda, whose kernels extend its tiled GEMM; it imports no target
TARGETS = ("backends.llvm", "backends.opencl", "backends.cuda", "backends.external", "backends.plaidml")
SHARED = {"backends.clike": ("backends.opencl", "backends.cuda")}  # shared code generator: who may import it
# NVIDIA's OpenCL path: opencl runs cuda's kernels (their emitters, the PTX rebuild, the launcher),
# and cuda's CUDA memory and launches work on opencl's buffers and executor (backends/cuda/README.md)
PAIRED = {("backends.opencl", "backends.cuda"), ("backends.cuda", "backends.opencl")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            subs = {f"{base}.{a.name}" for a in node.names} & set(known)
            found |= subs  # `from pkg import mod` is a dependency on mod
            if len(subs) < len(node.names):
                found.add(base)  # names defined in the package (or module) itself
    return {m for m in found if m in known and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_circles(graph):
    state: dict[str, int] = {}  # 1: on the path, 2: done
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.rpartition(".")[0] == node or node.rpartition(".")[0] == nxt:
                continue  # a package's __init__ and its own submodules: Python's package form
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_each_package_imports_only_the_layers_below(graph):
    bad = []
    for name, deps in graph.items():
        if name in USER_API:
            continue
        allowed = ALLOWED[name.split(".")[0]]
        bad += [
            f"{name} imports {d}"
            for d in sorted(deps)
            if d.split(".")[0] not in allowed and (name, d) not in EXCEPTIONS
        ]
        bad += [f"{name} imports the user API {d}" for d in sorted(deps) if d in USER_API - {"tile"}]
    assert not bad, "\n".join(bad)


def test_no_target_imports_another(graph):
    def target(mod: str) -> str | None:
        return next((t for t in TARGETS if mod == t or mod.startswith(t + ".")), None)

    def shared(mod: str) -> str | None:
        return next((s for s in SHARED if mod == s or mod.startswith(s + ".")), None)

    bad = [
        f"{name} imports {d}"
        for name, deps in graph.items()
        for d in sorted(deps)
        if (target(name) and target(d) and target(name) != target(d)
            and (target(name), target(d)) not in PAIRED)
        or (shared(name) and target(d))  # the shared generator imports no target
        or (shared(d) and not shared(name) and target(name) not in SHARED[shared(d)])
    ]
    assert not bad, "\n".join(bad)
