"""Row programs (``row_fusion``) on the local OpenCL device: one work-group per row
(``backends/clike/rowkernel.py``), compared with the Tile interpreter, exactly on integer-valued
inputs and within a tolerance growing with the row length for softmax. The configs are
``opencl_gpu`` with ``rows_per_unit`` 0 (so small tests fuse: the H100 needs 528 rows) and
``opencl_cpu`` as it is."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.driver import compile_bound
from backends.runner import CompiledProgram
from bench.gpu_reductions import LAYERNORM, SOFTMAX
from stripe.config import TARGETS, format_config, parse_config
from stripe.plans import RowPlan
from tests.opencl_support import DEVICE_ID, requires_opencl
from tile.bind import bind
from tile.inputs import input_types


@pytest.fixture(scope="module")
def gpu_config(tmp_path_factory) -> str:
    data = {"extends": "opencl_gpu", "name": "opencl_gpu", "params": {"row_programs": {"rows_per_unit": 0}}}
    path = tmp_path_factory.mktemp("cfg") / "opencl_gpu_rows.json"
    path.write_text(format_config(parse_config(json.dumps(data))))  # every step written out
    return str(path)


def _compiled(src: str, shapes: dict, settings: dict) -> CompiledProgram:
    prog = tile.parse(src)
    ins = {k: np.zeros(v, np.float32) for k, v in shapes.items()}
    return compile_bound(bind(prog, input_types(prog, ins)), registry.get(DEVICE_ID), settings)


def _row_kernels(cp: CompiledProgram) -> list[str]:
    return [i.block.name for i in cp.infos if isinstance(i.block.plan, RowPlan)]


@requires_opencl
@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (5, 3), (17, 257), (64, 1000), (9, 4096)])
@pytest.mark.parametrize("config", ["gpu", "opencl_cpu"])
def test_softmax_rows(gpu_config, shape, config):
    cfg = gpu_config if config == "gpu" else config
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 4
    settings = {"config": cfg, "cache": False}
    got = tile.compile(SOFTMAX, DEVICE_ID, settings)({"X": x})["Y"]
    want = ref_interp.run(SOFTMAX, {"X": x})["Y"]
    n, eps = shape[1], 2.0**-23
    # an exp (a few ulps), a sum of n terms (relative error <= n eps), a division
    np.testing.assert_allclose(got, want, rtol=4 * (n + 4) * eps, atol=0)
    if config == "gpu" and shape[1] > 1:
        assert len(_row_kernels(_compiled(SOFTMAX, {"X": shape}, settings))) == 1


@requires_opencl
@pytest.mark.parametrize("agg", ["+", "*", ">", "<"])
def test_each_aggregation_with_a_consumer_is_exact(gpu_config, agg):
    """A row aggregation read back by an elementwise consumer, with a second row value read by
    the consumer too: integer-valued, so exact in any order."""
    src = f"""function (X[M, N]) -> (Y) {{
      R[i, 0: M, 1] = {agg}(X[i, j]);
      C[i, 0: M, 1] = >(X[i, j]);
      Y = X * R + C;
    }}"""
    rng = np.random.default_rng(2)
    shape = (33, 300)
    if agg == "*":
        x = rng.choice(np.array([-1, 1], np.float32), shape)
        x[:, :3] = 2
    else:
        x = rng.integers(-8, 9, shape).astype(np.float32)
    settings = {"config": gpu_config, "cache": False}
    got = tile.compile(src, DEVICE_ID, settings)({"X": x})["Y"]
    np.testing.assert_array_equal(got, ref_interp.run(src, {"X": x})["Y"])
    assert len(_row_kernels(_compiled(src, {"X": shape}, settings))) == 1


@requires_opencl
@pytest.mark.parametrize("shape", [(1, 2), (5, 3), (37, 300), (16, 1024), (3, 4097)])
@pytest.mark.parametrize("config", ["gpu", "opencl_cpu"])
def test_layernorm_rows(gpu_config, shape, config):
    """The layernorm of issue 24 as one row program: the sum, the mean (a row value computed from
    it, which every work-item computes for itself), the variance of the centred row, then the
    normalisation with gain and bias along the row."""
    rng = np.random.default_rng(6)
    n = shape[1]
    ins = {"X": (rng.standard_normal(shape) * 3 + 1).astype(np.float32),
           "G": rng.standard_normal(n).astype(np.float32), "Bt": rng.standard_normal(n).astype(np.float32)}
    settings = {"config": gpu_config if config == "gpu" else config, "cache": False}
    got = tile.compile(LAYERNORM, DEVICE_ID, settings)(ins)["Y"]
    want = ref_interp.run(LAYERNORM, ins)["Y"]
    # the mean and the variance are sums of n terms (relative error <= n eps each, the variance's
    # terms centred by the rounded mean), then a sqrt, a division, a product and a sum
    eps = 2.0**-23
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * (n + 8) * eps * np.max(np.abs(want)))
    if config == "gpu":
        shapes = {k: v.shape for k, v in ins.items()}
        assert len(_compiled(LAYERNORM, shapes, settings).infos) == 1
        assert len(_row_kernels(_compiled(LAYERNORM, shapes, settings))) == 1


@requires_opencl
@pytest.mark.parametrize("form", ["inlined", "inner blocks", "untiled"])
def test_row_values_computed_from_row_values_are_exact(gpu_config, tmp_path, form):
    """Row values computed from others (``T`` from the sum and the max, ``U`` from ``T``), read by
    a later reduction and by the elementwise output: integer-valued, exact in any order. As the
    row block's own statements (``inline`` flattens one-point blocks), as one-point inner blocks
    (without ``inline``), and without work-groups (``tiled=False``: one work-item per row). ``Z``,
    one element per row, is stored once per row (work-item 0), not by every work-item."""
    src = """function (X[M, N]) -> (Y, Z) {
      S[i, 0: M, 1] = +(X[i, j]);
      Mx[i, 0: M, 1] = >(X[i, j]);
      T = S * 2 - Mx;
      U = T + 1;
      R[i, 0: M, 1] = <(X[i, j] * T[i, 0]);
      Y = X * U + R - T;
      Z = R * T;
    }"""
    x = np.random.default_rng(7).integers(-8, 9, (29, 130)).astype(np.float32)
    config = gpu_config
    if form == "inner blocks":
        data = json.loads(open(gpu_config).read())
        data["passes"] = [p for p in data["passes"] if p["pass"] != "inline"]
        config = str(tmp_path / "no_inline.json")
        open(config, "w").write(json.dumps(data))
    settings = {"config": config, "cache": False, "tiled": form != "untiled"}
    got = tile.compile(src, DEVICE_ID, settings)({"X": x})
    want = ref_interp.run(src, {"X": x})
    for name in ("Y", "Z"):  # Z: one element per row, a buffer the row block stores into once
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    cp = _compiled(src, {"X": x.shape}, settings)
    assert len(cp.infos) == 1 and len(_row_kernels(cp)) == 1


@requires_opencl
def test_rows_longer_than_max_row_in_groups_of_1024(gpu_config, tmp_path):
    """The long-rows variant measured for softmax 256 x 65536 (``max_row`` 65536, ``group`` 1024:
    one work-group of 1024 work-items per row, 64 points each per pass), on rows of 65536 and a
    layernorm of rows of 20000 (not a multiple of the group)."""
    data = json.loads(open(gpu_config).read())
    for step in data["passes"]:
        if step["pass"] == "row_fusion":
            step["params"].update(max_row=65536, group=1024)
    config = str(tmp_path / "long_rows.json")
    open(config, "w").write(json.dumps(data))
    settings = {"config": config, "cache": False}
    rng = np.random.default_rng(8)
    cases = [(SOFTMAX, {"X": rng.standard_normal((3, 65536)).astype(np.float32) * 4}),
             (LAYERNORM, {"X": rng.standard_normal((2, 20000)).astype(np.float32),
                          "G": rng.standard_normal(20000).astype(np.float32),
                          "Bt": rng.standard_normal(20000).astype(np.float32)})]
    for src, ins in cases:
        got = tile.compile(src, DEVICE_ID, settings)(ins)["Y"]
        want = ref_interp.run(src, ins)["Y"]
        n = ins["X"].shape[1]
        np.testing.assert_allclose(got, want, rtol=0, atol=8 * (n + 8) * 2.0**-23 * np.max(np.abs(want)))
        cp = _compiled(src, {k: v.shape for k, v in ins.items()}, settings)
        (info,) = cp.infos
        assert isinstance(info.block.plan, RowPlan) and info.block.plan.group <= 1024


@requires_opencl
def test_three_dimensional_rows_and_a_column_read(gpu_config):
    cases = [
        ("function (X[A, B, C]) -> (Y) { S[a, b, 0: A, B, 1] = +(X[a, b, c]); Y = X - S; }", (3, 5, 70)),
        ("function (X[N, N]) -> (Y) { S[i: N] = +(X[i, j]); Y[i, j: N, N] = =(X[i, j] + S[j]); }",
         (40, 40)),
    ]
    for src, shape in cases:
        x = np.random.default_rng(3).integers(-8, 9, shape).astype(np.float32)
        settings = {"config": gpu_config, "cache": False}
        got = tile.compile(src, DEVICE_ID, settings)({"X": x})["Y"]
        np.testing.assert_array_equal(got, ref_interp.run(src, {"X": x})["Y"], err_msg=src)
        assert len(_row_kernels(_compiled(src, {"X": shape}, settings))) == 1, src


@requires_opencl
def test_without_work_groups_the_general_kernel_runs_a_row(gpu_config):
    """``tiled=False`` (no work-groups): the row program is one work-item per row, same results."""
    x = np.random.default_rng(4).integers(-8, 9, (20, 50)).astype(np.float32)
    src = "function (X[M, N]) -> (Y) { S[i, 0: M, 1] = +(X[i, j]); Y = X - S; }"
    settings = {"config": gpu_config, "cache": False, "tiled": False}
    got = tile.compile(src, DEVICE_ID, settings)({"X": x})["Y"]
    np.testing.assert_array_equal(got, ref_interp.run(src, {"X": x})["Y"])
    assert _row_kernels(_compiled(src, {"X": (20, 50)}, settings))


def test_llvm_runs_a_row_program(tmp_path):
    """The LLVM CPU backend (whose config has no row_fusion) runs one too, as nested loops."""
    data = json.loads((TARGETS / "llvm_cpu.json").read_text())
    data["passes"].insert(0, {"name": "rows", "pass": "row_fusion",
                              "params": {"reqs": ["main"], "rows_per_unit": 0}})
    path = tmp_path / "llvm_rows.json"
    path.write_text(json.dumps(data))
    src = ("function (X[M, N]) -> (Y) { Mx[i, 0: M, 1] = >(X[i, j]); S[i, 0: M, 1] = +(X[i, j]); "
           "Y = X * S - Mx; }")
    x = np.random.default_rng(5).integers(-8, 9, (12, 30)).astype(np.float32)
    settings = {"config": str(path), "cache": False}
    got = tile.compile(src, "llvm_cpu.0", settings)({"X": x})["Y"]
    np.testing.assert_array_equal(got, ref_interp.run(src, {"X": x})["Y"])
    prog = tile.parse(src)
    cp = compile_bound(bind(prog, input_types(prog, {"X": x})), registry.get("llvm_cpu.0"), settings)
    assert _row_kernels(cp)
