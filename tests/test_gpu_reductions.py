"""Reductions through the ``opencl_gpu`` config: split into lanes before fusion (so a reduction
with an elementwise consumer stays parallel), combines as work-group trees in ``__local`` memory
(``backends/clike/groupreduce.py``). Run on the local OpenCL device (PoCL) with the GPU's config
and the H100's parallelism (132 compute units x 1024 work-items), so the split trees are the ones
the H100 runs; compared with the Tile interpreter, exactly on integer-valued inputs."""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.clike import groupreduce
from backends.driver import compile_bound
from backends.runner import CompiledProgram
from stripe.ir import walk
from tests.opencl_support import DEVICE_ID, h100_config, requires_opencl
from tests.pass_support import lowered, run_pass
from tile.bind import bind
from tile.inputs import input_types

AGG = ("+", "*", ">", "<")


@pytest.fixture(scope="module")
def gpu_config(tmp_path_factory) -> str:
    """opencl_gpu.json with the H100's parallelism in its split step."""
    return h100_config(tmp_path_factory, True)


@pytest.fixture(scope="module")
def split_config(tmp_path_factory) -> str:
    """The same with ``one_kernel`` off: a global reduction's combines are kernels of their own
    (tests/test_one_kernel_reduce.py tests it on)."""
    return h100_config(tmp_path_factory, False)


def _inputs(agg: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Integer-valued inputs whose results are exact in any order: sums of -1..1 (|partial sums|
    <= 2^24 up to 16M terms), products of +-1 with at most 20 twos, max/min of -50..50."""
    rng = np.random.default_rng(seed)
    if agg == "+":
        return rng.integers(-1, 2, shape).astype(np.float32)
    if agg == "*":
        x = rng.choice(np.array([-1, 1], np.float32), shape)
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, min(20, flat.size), replace=False)] *= 2
        return x
    return rng.integers(-50, 51, shape).astype(np.float32)


def _check(src: str, x: np.ndarray, config: str) -> CompiledProgram:
    got = tile.compile(src, DEVICE_ID, {"config": config, "cache": False})({"X": x})
    want = ref_interp.run(src, {"X": x})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{src} {x.shape}")


@requires_opencl
@pytest.mark.parametrize("agg", AGG)
@pytest.mark.parametrize("n", [1, 3, 7, 1000, 4099, 65536])
def test_global(gpu_config, agg, n):
    _check(f"function (X[N]) -> (S) {{ S[] = {agg}(X[i]); }}", _inputs(agg, (n,)), gpu_config)


@requires_opencl
@pytest.mark.parametrize("agg", ["+", ">"])
def test_global_16m(gpu_config, agg):
    _check(f"function (X[M, N]) -> (S) {{ S[] = {agg}(X[i, j]); }}", _inputs(agg, (4096, 4096)), gpu_config)


@requires_opencl
@pytest.mark.parametrize("agg", AGG)
@pytest.mark.parametrize("shape", [(1, 1), (3, 4099), (13, 1000), (1000, 3), (257, 8192), (5, 65537)])
def test_rows_and_columns(gpu_config, agg, shape):
    x = _inputs(agg, shape, seed=1)
    _check(f"function (X[M, N]) -> (S) {{ S[i: M] = {agg}(X[i, j]); }}", x, gpu_config)
    _check(f"function (X[M, N]) -> (S) {{ S[j: N] = {agg}(X[i, j]); }}", x.T.copy(), gpu_config)


@requires_opencl
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_other_dtypes(gpu_config, dtype):
    """Wrapping integer sums and products (exact in any order), and float64: through trees of 512
    lanes per row (65536 columns) and through the general combine (9000 columns: 64 lanes)."""
    for cols in (9000, 65536):
        x = np.random.default_rng(2).integers(-3, 4, (3, cols)).astype(dtype)
        for agg in AGG:
            if agg == "*" and dtype == np.float64:
                continue
            _check(f"function (X[M, N]) -> (S) {{ S[i: M] = {agg}(X[i, j]); }}", x, gpu_config)


@requires_opencl
@pytest.mark.parametrize("shape", [(3, 4099), (64, 8192)])
def test_reductions_with_consumers(gpu_config, shape):
    """Softmax (row max, then the denominators' sum, each with an elementwise consumer) and the
    exp of a global max, within the rounding of exp and of the n-term sum."""
    src = """function (X[M, N]) -> (Y, Z) {
      Mx[i, 0: M, 1] = >(X[i, j]);
      E = exp(X - Mx);
      S[i, 0: M, 1] = +(E[i, j]);
      Y = E / S;
      G[] = >(X[i, j]);
      Z = exp(G);
    }"""
    x = np.random.default_rng(3).integers(-8, 9, shape).astype(np.float32)
    got = tile.compile(src, DEVICE_ID, {"config": gpu_config, "cache": False})({"X": x})
    want = ref_interp.run(src, {"X": x})
    n, eps = shape[1], 2.0**-23
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=4 * n * eps, atol=0)
    np.testing.assert_allclose(got["Z"], want["Z"], rtol=4 * eps, atol=0)


def _program(src: str, shape: tuple[int, ...], config: str, strict: bool = False):
    prog = tile.parse(src)
    x = np.zeros(shape, np.float32)
    settings = {"config": config, "strict": strict, "cache": False}
    return compile_bound(bind(prog, input_types(prog, {"X": x})), registry.get(DEVICE_ID), settings)


@requires_opencl
def test_row_max_with_consumer_stays_split(gpu_config):
    """A row max splits into partial lanes and a combine (no written mask: every row is
    written); strict mode splits nothing."""
    src = "function (X[M, N]) -> (S) { S[i: M] = >(X[i, j]); }"
    cp = _program(src, (64, 8192), gpu_config)
    tags = [b.tags for b in walk(cp.program)]
    assert any("split_partial" in t for t in tags)
    names = [i.block.name for i in cp.infos]
    assert any("partial" in n for n in names) and any("combine" in n for n in names), names
    strict = _program(src, (64, 8192), gpu_config, strict=True)
    assert not any("split_partial" in b.tags for b in walk(strict.program))


@requires_opencl
def test_combines_of_many_lanes_are_trees(split_config):
    """A global sum's last combines, a global max's (``one_kernel`` off), and row sums of few long
    rows (5 rows of 512 lanes)."""
    for src, shape in (("function (X[N]) -> (S) { S[] = +(X[i]); }", (1 << 20,)),
                       ("function (X[N]) -> (S) { S[] = >(X[i]); }", (65536,)),
                       ("function (X[M, N]) -> (S) { S[i: M] = +(X[i, j]); }", (5, 65537))):
        cp = _program(src, shape, split_config)
        assert any(groupreduce.takes(i.block, i.buffers, _target()) for i in cp.infos), src


def _target():
    from backends.opencl.target import OpenCLTarget

    t = OpenCLTarget()
    t.workgroups = True
    return t


def test_fusion_leaves_tagged_producers_alone():
    """``a_skip``: a producer carrying a skipped tag does not fuse with its consumer; without it,
    the same pair fuses (the default is unchanged)."""
    src = "function (X[M, N]) -> (Y) { S[i: M] = >(X[i, j]); Y = S + 1; }"
    prog = lowered(src, {"X": (4, 8)})
    params = {"a_reqs": ["contraction"], "b_reqs": ["eltwise"]}
    fused = run_pass("fusion", params, prog)
    assert any("fused" in b.tags for b in walk(fused))
    kept = run_pass("fusion", {**params, "a_skip": ["contraction"]}, prog)
    assert not any("fused" in b.tags for b in walk(kept))


@requires_opencl
def test_a_global_reduction_is_three_kernels_without_fills(split_config):
    """A 4096x4096 max (``one_kernel`` off): the partial lanes and both combines start from the
    identity themselves (``split_reduction``'s ``self_init``), and the output's fill goes with its
    last combine: three kernels, the two combines work-group trees. Reused buffers hold the last
    call's values, so a second call with smaller values checks that nothing depends on a fill."""
    src = "function (X[M, N]) -> (S) { S[] = >(X[i, j]); }"
    cp = _program(src, (4096, 4096), split_config)
    assert len(cp.infos) == 3 and not any("special" in i.block.tags for i in cp.infos), cp.infos
    trees = [i for i in cp.infos if groupreduce.takes(i.block, i.buffers, _target())]
    assert len(trees) == 2 and all(t.block.has_tags("split_combine") for t in trees)
    exe = tile.compile(src, DEVICE_ID, {"config": split_config, "cache": False})
    rng = np.random.default_rng(4)
    for lo in (0, -100):
        x = rng.integers(lo - 50, lo, (512, 512)).astype(np.float32)
        assert exe({"X": x})["S"] == x.max()
