"""docs/ops.md, the op reference, is what ``python -m tile.ops.doc`` writes from tile/ops/ today:
every op has an example call and a PyTorch equivalent that exists, and each example's source is a
program the front end accepts."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

import tile
import tile.ops
from tile.ops import doc


def test_docs_ops_md_is_the_generated_page():
    written = doc.DOC_PATH.read_text() if doc.DOC_PATH.exists() else ""
    assert written == doc.render(), (
        f"docs/ops.md is out of date with tile/ops/: run `{doc.COMMAND}` and commit docs/ops.md"
    )


def test_every_op_has_an_example_and_a_torch_equivalent_on_the_page():
    assert set(doc.EXAMPLES) == set(tile.ops.__all__)
    page = doc.render()
    for name in tile.ops.__all__:
        assert f"### `{name}`" in page
        assert doc.torch_equivalent(name).startswith("torch.")
        assert doc.source(name).rstrip("\n") in page


@pytest.mark.parametrize("name", sorted(tile.ops.__all__))
def test_each_example_source_is_accepted_by_the_front_end(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a lint warning would be a typo in an op
        tile.compile(doc.source(name), device="interp")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="the PyTorch equivalents are resolved in torch, which is not installed")
def test_every_torch_equivalent_exists_in_torch():
    import torch

    for name in tile.ops.__all__:
        pattern = doc.torch_equivalent(name)
        for qualified in sorted({pattern.format(nd=nd) for nd in (1, 2, 3)}):
            obj = torch
            for part in qualified.split(".")[1:]:
                assert hasattr(obj, part), f"{name}: {qualified} is not in torch {torch.__version__}"
                obj = getattr(obj, part)
            assert callable(obj), qualified


def test_write_writes_the_page(tmp_path):
    target = tmp_path / "ops.md"
    assert doc.main(["--write", str(target)]) == 0
    assert target.read_text() == doc.render()
