"""A global reduction as one kernel (``opencl_gpu``'s ``one_kernel``): the partials' work-groups
and the last of them, found with an atomic counter, combining (``stripe/passes/one_kernel.py``,
``backends/clike/lastgroup.py``). Run on the local OpenCL device (PoCL) with the GPU's config and
the H100's parallelism (132 compute units x 1024 work-items), so the lanes and groups are the ones
the H100 runs; compared with the Tile interpreter exactly on integer-valued inputs, over many
sizes (one group, a short last group, 512 groups), repeated calls (the counter resets itself),
several reductions in one program, a consumer, and two programs running at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.driver import compile_bound
from backends.zeroing import needs_zero, zeroed_once
from stripe.ir import walk
from stripe.parser import parse_stripe
from stripe.plans import CombinePlan
from stripe.printer import format_block
from stripe.verify import verify
from tests.opencl_support import DEVICE_ID, h100_config, requires_opencl
from tile.bind import bind
from tile.inputs import input_types

SUM = "function (X[N]) -> (S) { S[] = +(X[i]); }"


@pytest.fixture(scope="module")
def gpu_config(tmp_path_factory) -> str:
    """opencl_gpu.json with the H100's parallelism in its split step."""
    return h100_config(tmp_path_factory, True)


@pytest.fixture(scope="module")
def three_kernels(tmp_path_factory) -> str:
    """The same with ``one_kernel`` off: the partials and two combines, as before."""
    return h100_config(tmp_path_factory, False)


def _inputs(agg: str, shape: tuple[int, ...], dtype=np.float32, seed: int = 0) -> np.ndarray:
    """Integer-valued inputs whose results are exact in any order (tests/test_gpu_reductions.py)."""
    rng = np.random.default_rng(seed)
    if agg == "+":
        return rng.integers(-1, 2, shape).astype(dtype)
    if agg == "*":
        x = rng.choice(np.array([-1, 1], dtype), shape)
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, min(20, flat.size), replace=False)] *= 2
        return x
    return rng.integers(-50, 51, shape).astype(dtype)


def _program(src: str, x: np.ndarray, config: str):
    prog = tile.parse(src)
    settings = {"config": config, "cache": False}
    return compile_bound(bind(prog, input_types(prog, {"X": x})), registry.get(DEVICE_ID), settings)


def _exact(cp, src: str, x: np.ndarray, calls: int = 3) -> None:
    """Calls alternating ``x`` and ``-x`` (a sum, max or min that changes: a kernel whose counter
    was left past zero would leave the last call's result), each exact."""
    for k in range(calls):  # the counter must be back at zero for every next call
        arg = x if k % 2 == 0 else -x
        want = ref_interp.run(src, {"X": arg})
        got = cp({"X": arg})
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{src} {x.shape} call {k}")


def _one_kernels(cp) -> list:
    return [i for i in cp.infos if isinstance(i.block.plan, CombinePlan) and i.block.plan.counter]


@requires_opencl
def test_a_global_sum_of_16m_is_one_kernel(gpu_config, three_kernels):
    """2^24 floats: one kernel (was three: the partials, 1024 combines of 128, the last of 1024),
    the same 131072 lanes of 128 values each, in 512 work-groups of 256; the last group combines."""
    x = _inputs("+", (1 << 24,))
    cp = _program(SUM, x, gpu_config)
    assert len(cp.infos) == 1 and len(_one_kernels(cp)) == 1, [i.name for i in cp.infos]
    assert cp.infos[0].name.startswith("sum_131072x128")
    assert "atomic_inc" in cp.library.source and "mem_fence(CLK_GLOBAL_MEM_FENCE)" in cp.library.source
    assert "reqd_work_group_size(256, 1, 1)" in cp.library.source
    _exact(cp, SUM, x)
    before = _program(SUM, x, three_kernels)
    assert len(before.infos) == 3 and not _one_kernels(before)


@requires_opencl
@pytest.mark.parametrize("agg", ["+", "*", ">", "<"])
@pytest.mark.parametrize("n", [1, 3, 2048, 4099, 8193, 32773, 65536, 1000003])
def test_sizes(gpu_config, agg, n):
    """One group (2048: 16 lanes; 8193: 64), several (65536: 2 of 256; 1000003: 16), an odd size
    whose lanes' last steps are cut by a constraint; too short to split (1, 3): as before."""
    src = f"function (X[N]) -> (S) {{ S[] = {agg}(X[i]); }}"
    x = _inputs(agg, (n,), seed=n)
    cp = _program(src, x, gpu_config)
    if n >= 2048:
        assert len(cp.infos) == 1 and _one_kernels(cp), [i.name for i in cp.infos]
    _exact(cp, src, x)


@requires_opencl
@pytest.mark.parametrize("agg", ["+", ">"])
def test_matrix_16m(gpu_config, agg):
    """A 4096x4096 matrix: lanes over both indexes (split_reduction's second split), one kernel."""
    src = f"function (X[M, N]) -> (S) {{ S[] = {agg}(X[i, j]); }}"
    x = _inputs(agg, (4096, 4096), seed=5)
    cp = _program(src, x, gpu_config)
    assert len(cp.infos) == 1 and _one_kernels(cp)
    _exact(cp, src, x, calls=2)


@requires_opencl
@pytest.mark.parametrize("shape", [(64, 64), (257, 8192), (3, 100003)])
def test_matrices(gpu_config, shape):
    for agg in ("+", "<"):
        src = f"function (X[M, N]) -> (S) {{ S[] = {agg}(X[i, j]); }}"
        x = _inputs(agg, shape, seed=7)
        cp = _program(src, x, gpu_config)
        assert len(cp.infos) == 1 and _one_kernels(cp)
        _exact(cp, src, x)


@requires_opencl
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_other_dtypes(gpu_config, dtype):
    """Wrapping integer sums and products, exact in any order, and float64."""
    for agg in ("+", "*", ">", "<"):
        src = f"function (X[N]) -> (S) {{ S[] = {agg}(X[i]); }}"
        x = _inputs(agg, (300007,), dtype=dtype, seed=11)
        cp = _program(src, x, gpu_config)
        assert _one_kernels(cp)
        _exact(cp, src, x)


@requires_opencl
def test_calls_with_new_inputs(gpu_config):
    """Each call finds the counter at zero: ten calls with different data, each exact."""
    cp = _program(SUM, _inputs("+", (1 << 20,)), gpu_config)
    for seed in range(10):
        x = _inputs("+", (1 << 20,), seed=seed)
        assert cp({"X": x})["S"] == x.sum()


@requires_opencl
def test_float_sums_stay_within_reassociation_bounds(gpu_config, three_kernels):
    """Random floats: the one kernel regroups the combine (groups of 256 adjacent lanes, then the
    groups), so it may differ from the three kernels in rounding, within k*eps*K*max|x| of the
    exact sum; and it gives the same bits at every call (a fixed order)."""
    x = np.random.default_rng(3).standard_normal(1 << 22).astype(np.float32)
    exact = float(np.sum(x, dtype=np.float64))
    bound = 4 * 2.0**-24 * x.size * float(np.abs(x).max())
    cp = _program(SUM, x, gpu_config)
    got = {float(cp({"X": x})["S"]) for _ in range(4)}
    assert len(got) == 1 and abs(got.pop() - exact) <= bound
    before = float(_program(SUM, x, three_kernels)({"X": x})["S"])
    assert abs(before - exact) <= bound


@requires_opencl
def test_several_reductions_and_a_consumer(gpu_config):
    """Three global reductions, each one kernel with its own counter; a sum feeding an elementwise
    consumer: the reduction's kernel, then the consumer's (fusion leaves the combine alone)."""
    src = """function (X[N]) -> (S, M, L, Y) {
      S[] = +(X[i]);
      M[] = >(X[i]);
      L[] = <(X[i]);
      Y = X * S + M;
    }"""
    x = _inputs("+", (1 << 20,), seed=9)
    cp = _program(src, x, gpu_config)
    ones = _one_kernels(cp)
    assert len(ones) == 3 and len(cp.infos) == 4, [i.name for i in cp.infos]
    assert len({i.block.plan.counter for i in ones}) == 3
    _exact(cp, src, x)


@requires_opencl
def test_two_programs_at_once(gpu_config):
    """Two programs (their own counters) called from two threads, interleaved, each exact."""
    xs = [_inputs("+", (1 << 20,), seed=1), _inputs(">", (300007,), seed=2)]
    srcs = [SUM, "function (X[N]) -> (S) { S[] = >(X[i]); }"]
    cps = [_program(s, x, gpu_config) for s, x in zip(srcs, xs)]
    wants = [xs[0].sum(), xs[1].max()]
    errors: list[str] = []

    def loop(k: int) -> None:
        for _ in range(15):
            got = cps[k]({"X": xs[k]})["S"]
            if got != wants[k]:
                errors.append(f"program {k}: {got} != {wants[k]}")

    threads = [threading.Thread(target=loop, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@requires_opencl
def test_the_counter_is_zeroed_once_and_the_partials_never(gpu_config):
    """The runner zeroes the counter when it allocates it (never per call: the kernel leaves it
    at zero), and the partials' buffer never (the nested partial block writes all of it first)."""
    cp = _program(SUM, _inputs("+", (1 << 20,)), gpu_config)
    counters = zeroed_once(cp.program)
    assert counters == {_one_kernels(cp)[0].block.plan.counter}
    assert not needs_zero(cp.program, frozenset({"X"})) & (counters | {_one_kernels(cp)[0].block.plan.src})


@requires_opencl
def test_the_plan_prints_parses_and_verifies(gpu_config):
    """The nested form is Stripe like any other: its plan names the counter, the text round trips,
    and ``verify`` accepts it."""
    cp = _program(SUM, _inputs("+", (1 << 20,)), gpu_config)
    verify(cp.program)
    assert parse_stripe(format_block(cp.program)) == cp.program
    (k,) = _one_kernels(cp)
    assert k.block.plan.one_kernel and "one_kernel" in k.block.tags
    assert any("counter" in r.tags for r in cp.program.refs)
    assert sum("split_partial" in b.tags for b in walk(k.block)) == 2  # the partial and the combine


@requires_opencl
def test_strict_mode_splits_nothing(gpu_config):
    cp = tile.compile(SUM, DEVICE_ID, {"config": gpu_config, "cache": False, "strict": True})
    x = _inputs("+", (65536,))
    assert cp({"X": x})["S"] == x.sum()
    assert not _one_kernels(cp._last)


@requires_opencl
def test_float16_sums_split_over_float32_partials(gpu_config):
    """A float16 sum's partials are float32 (``split_reduction.partial_dtype``): its partial block
    writes them self-initialised and one combine reads them, two kernels (three while they were
    float16: a fill, the partials, a combine); not one kernel, as the output's float16 is still
    not kept in registers (``one_kernel.NO_REGISTER``). Exact on these values."""
    x = _inputs("+", (1 << 20,), dtype=np.float16)
    cp = _program(SUM, x, gpu_config)
    assert len(cp.infos) == 2 and not _one_kernels(cp), [i.name for i in cp.infos]
    parts = {b: d.value for i in cp.infos for b, d in zip(i.buffers, i.buffer_dtypes)}
    assert parts["S_part"] == "float32" and parts["S"] == "float16", parts
    _exact(cp, SUM, x)
