"""Statements in the documents that the code can check: docs/semantics.md §9's error table names
every ``TileError`` subclass in the code base and its warnings paragraph every warning class, its
example error is what ``tile check`` prints, and the README's count of conformance families is the
suite's.

Classes are found by reading the source of the packages that make up Tile (``ast``, no imports),
so a class in a module that needs an optional package is found too. The example plugin
(``examples/tile_c_backend``) is a separate package with errors of its own and is not scanned.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tile", "ref_interp", "stripe", "backends", "conformance")
NUMBERS = {w: n for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def defined_classes() -> dict[str, list[tuple[str, list[str]]]]:
    """Every class defined in the packages: name -> [(module, base names)]."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = [b.attr if isinstance(b, ast.Attribute) else b.id
                             for b in node.bases if isinstance(b, ast.Name | ast.Attribute)]
                    found.setdefault(node.name, []).append((module, bases))
    return found


def subclasses(roots: set[str]) -> dict[str, str]:
    """The classes deriving, directly or not, from one of ``roots``: name -> defining module."""
    classes = defined_classes()
    out: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, defs in classes.items():
            for module, bases in defs:
                if name not in out and name not in roots and any(b in roots or b in out for b in bases):
                    out[name] = module
                    changed = True
    return out


def section(document: str, heading: str) -> str:
    """The text of ``document`` from the line ``heading`` to the next heading of its level."""
    text = (REPO / document).read_text()
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start:end if end >= 0 else len(text)]


def error_table() -> dict[str, str]:
    """§9's table: class name (the first name in a row, the last part if dotted) -> its kind."""
    rows = {}
    for line in section("docs/semantics.md", "## 9. Errors").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            name = re.match(r"`([\w.]+)`", cells[0])[1]
            rows[name.rsplit(".", 1)[-1]] = cells[1]
    return rows


def test_the_error_table_lists_every_tile_error_subclass_with_its_kind():
    errors = subclasses({"TileError"})
    assert "TileSyntaxError" in errors and "StripeError" in errors  # the scan sees the packages
    table = error_table()
    missing = sorted(set(errors) - set(table))
    assert not missing, f"docs/semantics.md §9's error table lacks {missing} (defined in " \
                        f"{sorted({errors[m] for m in missing})})"
    for name, module in errors.items():
        cls = getattr(importlib.import_module(module), name)
        assert table[name] == cls.kind, f"§9 gives {name} the kind {table[name]!r}; it prints {cls.kind!r}"


def test_the_errors_section_names_every_warning_class():
    warnings_ = subclasses({"Warning", "UserWarning", "TileWarning"})
    assert {"TilePrecisionWarning", "TileIndexWarning", "CacheWarning"} <= set(warnings_)
    text = section("docs/semantics.md", "## 9. Errors")
    missing = sorted(w for w in warnings_ if w != "TileWarning" and f"{w}`" not in text)
    assert not missing, f"docs/semantics.md §9 does not name the warnings {missing}"
    assert "only warning" not in text


def test_the_example_error_is_what_tile_check_prints(tmp_path):
    text = section("docs/semantics.md", "## 9. Errors")
    shown = re.search(r"```\n(matmul\.tile:.*?)\n```", text, re.S)[1]
    program = "function (A[M, L], B[L, N]) -> (C) {\n    C[i, j: M, N] = +(Q[i, k] * B[k, j]);\n}\n"
    (tmp_path / "matmul.tile").write_text(program)
    r = subprocess.run([sys.executable, "-m", "tile", "check", "matmul.tile"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == shown.strip()


@pytest.mark.parametrize("document", ["README.md", "docs/new_target.md", "conformance/README.md"])
def test_the_count_of_conformance_families_is_the_suites(document):
    from conformance import strategies

    families = list(strategies.FAMILIES)
    text = (REPO / document).read_text()
    counted = "|".join(NUMBERS)
    m = re.search(rf"\b({counted}) families\b", text, re.I)
    assert m, f"{document} says no '<number> families'"
    assert NUMBERS[m[1].lower()] == len(families), (
        f"{document} says {m[1]} families; conformance/strategies.py has {len(families)}: {families}")
    paragraph = text[m.start():text.find("\n\n", m.start())]
    for family in families:
        assert f"`{family}`" in paragraph or family in paragraph, f"{document} does not name {family}"
    tests = (REPO / "conformance" / "test_conformance.py").read_text()
    for family in families:  # each family is a test of the suite
        assert f"def test_{family}(" in tests, family
