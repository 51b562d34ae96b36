"""One vendor, one home (docs/architecture.md, issue 39): NVIDIA's words stay in ``backends/cuda``.

The language (``tile/``), the IR and its passes (``stripe/``), the interpreter (``ref_interp/``),
the portable C-like generator (``backends/clike/``) and the compile spine (``backends/driver.py``)
name no NVIDIA instruction, ISA or driver call, in code, comments or docstrings: what they know of
a matrix unit is its shapes, fragments and types (``stripe.hardware``). The vendor's configs
(``stripe/targets/cuda.json``, ``opencl_gpu.json``) are data naming the vendor's package, not code,
and are not read here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERIC = ("tile", "stripe", "ref_interp", "backends/clike", "backends/driver.py")
SUFFIXES = {".py", ".md", ".lark"}
WORDS = ("wgmma", "PTX", "sm_90", "cuLaunch", "cuMem", "ldmatrix", "cp.async", "mma.sync")
# any case: ``WgmmaEmitter`` and ``ptx.py`` name the vendor as surely as ``wgmma`` and ``PTX``
VENDOR = re.compile("|".join(re.escape(w) for w in WORDS), re.IGNORECASE)


def generic_files() -> list[Path]:
    found = []
    for place in GENERIC:
        path = ROOT / place
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
        found += [p for p in files if "__pycache__" not in p.parts]
    return found


def vendor_words(text: str) -> list[tuple[int, str]]:
    """Each line (from 1) of ``text`` that names a vendor word, with the word as written."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in VENDOR.finditer(line)]


@pytest.mark.parametrize(
    "line",
    ["emits mma.sync.aligned", "# PTX text", "WgmmaEmitter", "sm_90a", "cuLaunchKernel", "cuMemCreate",
     "ldmatrix.x4", "cp.async.commit_group", "from backends.cuda.ptx import for_sm90a"],
)
def test_the_scan_finds_each_word_however_written(line):
    assert vendor_words(line), line


def test_the_scan_passes_vendor_neutral_words():
    assert not vendor_words("a matrix unit's fragments, an mma_tiles list, cuda as a package name, pass")


def test_generic_code_names_no_vendor_instruction_or_call():
    files = generic_files()
    assert ROOT / "backends/driver.py" in files and ROOT / "stripe/hardware.py" in files
    assert any(p.parent == ROOT / "backends/clike" for p in files)
    bad = [
        f"{p.relative_to(ROOT)}:{n}: {word}"
        for p in files
        for n, word in vendor_words(p.read_text(encoding="utf-8"))
    ]
    why = "vendor words outside backends/cuda (move the code there, or say it without them):"
    assert not bad, "\n".join([why, *bad])


# ------------------------------------------------------------------------------ opencl and cuda
def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Each module ``path`` imports (at any depth, inside functions too), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def test_the_scan_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from backends.cuda.tma import unit_emitter\n    import backends.cuda\n")
    assert [m for _, m in imported_modules(f)] == [
        "backends.cuda.tma", "backends.cuda.tma.unit_emitter", "backends.cuda"
    ]


def test_opencl_imports_no_vendor_package():
    """``backends/cuda`` builds on OpenCL (its launches and shared memory use OpenCL's driver and
    executor), so OpenCL reaches it only through the hooks it owns (``backends.opencl.vendors``):
    no import of ``backends.cuda`` in ``backends/opencl``, and so no circle between the two."""
    bad = [
        f"{p.relative_to(ROOT)}:{n}: {m}"
        for p in sorted((ROOT / "backends/opencl").rglob("*.py"))
        for n, m in imported_modules(p)
        if m == "backends.cuda" or m.startswith("backends.cuda.")
    ]
    assert not bad, "\n".join(["backends/opencl imports the vendor (register a hook instead):", *bad])
    cuda = [m for p in (ROOT / "backends/cuda").rglob("*.py") for _, m in imported_modules(p)]
    assert any(m.startswith("backends.opencl") for m in cuda)  # the one direction there is


def test_the_vendor_hooks_reach_opencl():
    """The OpenCL target finds NVIDIA's kernels, the PTX rebuild and the launching executor
    through the registered hooks."""
    import numpy as np

    from backends.cuda import launch, ptx, render
    from backends.cuda.wgmma import SM90A
    from backends.opencl import vendors
    from tests.gemm_corpus import MM, nest_of

    (nvidia,) = [v for v in vendors.vendors() if v.name == "nvidia"]
    nest = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float16, prof="ampere")
    kernel = nest.t.unit_emitter(nest.g, nest.ptrs, nest.tiles, "tensor_core.f16", nest.epilogue)
    assert isinstance(kernel, render.UnitKernel) and nvidia.rebuild is ptx.for_sm90a
    assert nest.t.unit_emitter(nest.g, nest.ptrs, nest.tiles, "tensor_core.f64", nest.epilogue) is None
    assert nvidia.executor is launch.LaunchingExecutor
    assert vendors.rebuilding(f"x {SM90A}wgmma.fence.sync.aligned; y") is nvidia
    assert vendors.rebuilding("__kernel void k() {}") is None


# ------------------------------------------------------------------------------ launch facts
LAUNCH_FACT = re.compile(r"\blaunch_\w+|\.launched\(")


def test_the_launch_scan_finds_the_old_facts():
    old = ("wg.launch_local_KiB", "model.launch_ranking(unit)", "wg.launched(mode)", '"launch_tiles": []')
    for line in old:
        assert LAUNCH_FACT.search(line), line
    assert not LAUNCH_FACT.search("a kernel launched through its backend, launches, launch")


def test_stripe_keeps_no_launch_path_facts():
    """What tiles a backend's launched kernel takes, with what K step, for which modes and with
    how much memory are the backend's (``backends.cuda.launched``), not the hardware model's or
    the cost model's: ``stripe/`` (its code and its configs) names none of them, and the matrix
    unit carries them in its opaque ``backend`` entry."""
    import dataclasses

    from stripe.gemm_model import GemmModel
    from stripe.hardware import Hardware, MatrixUnit, WarpGroup

    files = [p for p in sorted((ROOT / "stripe").rglob("*")) if p.suffix in {".py", ".json", ".md"}]
    bad = [
        f"{p.relative_to(ROOT)}:{n}: {m.group(0)}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for m in LAUNCH_FACT.finditer(line)
    ]
    assert not bad, "\n".join(["launch-path facts in stripe/ (they are backends/cuda/launched.py's):", *bad])
    for cls in (Hardware, MatrixUnit, WarpGroup):
        assert not [f.name for f in dataclasses.fields(cls) if "launch" in f.name], cls
    assert not [name for name in vars(GemmModel) if "launch" in name]


def test_the_launched_tiles_reach_gemm_tile_through_the_backends_ranking():
    from backends.cuda import launched
    from stripe.config import target_config
    from stripe.passes import gemm_tile

    unit = target_config("cuda").hardware.matrix_units["tensor_core"]  # (imports backends.cuda.kmajor)
    assert launched.ranking in gemm_tile._RANKINGS
    facts = launched.of(unit)
    assert facts.tiles and not facts.local_KiB and facts.launched("f16") == ()  # no device: none
    here = launched.of(launched.with_local(unit, 227.0))
    assert here.local_KiB == 227.0 and here.launched("f16") == facts.tiles
    assert here.launched("3xtf32") == facts.fold_tiles and here.launched("f64") == ()
