"""tile.onnx builds on Tile's public helpers only: no module of it imports a private name (one
starting with ``_``) from another package; the AST renaming it inlines ``tile.ops`` with is
``tile.ast.rename_statement``, shared with custom gradients."""

from __future__ import annotations

import ast as pyast
from pathlib import Path

from tile import ast
from tile.parser import parse

ONNX = Path(__file__).resolve().parent.parent / "tile" / "onnx"


def test_tile_onnx_imports_no_private_name_from_elsewhere():
    found = []
    for path in sorted(ONNX.glob("*.py")):
        for node in pyast.walk(pyast.parse(path.read_text(), str(path))):
            if isinstance(node, pyast.ImportFrom) and node.module and not node.module.startswith("tile.onnx"):
                found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and a.name != "__future__"]
    assert found == []


def test_rename_statement_renames_tensors_and_replaces_sizes():
    program = parse("function (A[N, K], B[K, M]) -> (C) { C[i, j: N, M] = +(A[i, k] * B[k, j]); }")
    stmt = program.stmts[0]
    subst = {"A": ast.Name("X"), "B": ast.Name("Y"), "C": ast.Name("Z"),
             "N": ast.IntLit(2), "M": ast.IntLit(3)}
    text = ast.format_statement(ast.rename_statement(stmt, subst)).strip()
    assert text.replace(" ", "") == "Z[i,j:2,3]=+(X[i,k]*Y[k,j]);"
    assign = parse("function (A) -> (B) { B = exp(A) + A; }").stmts[0]
    renamed = ast.rename_statement(assign, {"A": ast.Name("Q")})
    assert ast.format_statement(renamed).strip() == "B = exp(Q) + Q;"
