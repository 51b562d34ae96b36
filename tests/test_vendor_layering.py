"""One vendor, one home (docs/architecture.md, issue 39): NVIDIA's words stay in ``backends/cuda``.

The language (``tile/``), the IR and its passes (``stripe/``), the interpreter (``ref_interp/``),
the portable C-like generator (``backends/clike/``) and the compile spine (``backends/driver.py``)
name no NVIDIA instruction, ISA or driver call, in code, comments or docstrings: what they know of
a matrix unit is its shapes, fragments and types (``stripe.hardware``). The vendor's configs
(``stripe/targets/cuda.json``, ``opencl_gpu.json``) are data naming the vendor's package, not code,
and are not read here.
"""

from __future__ import annotations

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
