"""The attention forward on the tensor cores (``backends.cuda.render_attention``, issue 41).

Without a GPU (where NVRTC or nvcc is installed): which attention blocks get the tensor-core kernel
on a stand-in sm_90 device, and that its CUDA compiles. On a GPU (``cuda.0``): its results against
float64 within ``conformance.attention``'s tolerance, on shapes that reach every path of the kernel
(padded heads, element-by-element staging, partial blocks, masks, heads sharing K and V).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from backends import driver, registry
from backends.cuda import nvrtc
from conformance.attention import (
    Spec,
    assert_close,
    assert_gradients_close,
    gradient_inputs,
    gradient_reference,
    gradient_source,
    inputs,
    reference,
    source,
)
from tests.test_cuda_device import _stand_in
from tile.parser import parse

pytestmark = pytest.mark.skipif(nvrtc.compiler() is None,
                                reason="no CUDA compiler here (neither NVRTC nor nvcc)")


def _build(spec: Spec, strict: bool = False, gradient: bool = False):
    npdt = ml_dtypes.bfloat16 if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
    ins = gradient_inputs(spec) if gradient else inputs(spec)
    ins = {k: v.astype(npdt) for k, v in ins.items()}
    bound = driver.bind_inputs(parse(gradient_source(spec) if gradient else source(spec)), ins)
    return driver.build(bound, _stand_in(), {"strict": strict, "cache": False}).library


@pytest.mark.parametrize("spec", [
    Spec(batch=(2, 3), rows=100, keys=100, depth=64, width=64, dtype="float16", mask="constraint"),
    Spec(batch=(4,), rows=70, keys=33, depth=128, width=96, dtype="bfloat16"),
    Spec(batch=(2,), rows=9, keys=9, depth=5, width=3, dtype="float16", shared_kv=True, mask="constraint"),
    Spec(batch=(2,), rows=64, keys=64, depth=64, width=64, dtype="float16", bias=True),  # score kernels
    Spec(batch=(2,), rows=70, keys=50, depth=64, width=64, dtype="bfloat16", mask="cond"),
])
def test_half_attention_runs_on_the_tensor_cores(spec):
    lib = _build(spec)
    assert len(lib.extra["names"]) == 1, "the chain is one fused kernel"
    assert "mma.sync.aligned.m16n8k16" in lib.source and "ldmatrix" in lib.source
    assert b".entry" in lib.handle


@pytest.mark.parametrize("spec, why", [
    (Spec(batch=(2,), rows=64, keys=64, depth=64, width=64, dtype="float32"), "float32 operands"),
    (Spec(batch=(2,), rows=64, keys=64, depth=200, width=64, dtype="float16"), "a head too wide"),
])
def test_other_attention_keeps_the_portable_kernel(spec, why):
    lib = _build(spec)
    assert len(lib.extra["names"]) == 1, f"still fused ({why})"
    assert "mma.sync" not in lib.source, f"tensor cores taken despite {why}"


@pytest.mark.parametrize("spec", [
    Spec(batch=(2, 3), rows=100, keys=100, depth=64, width=64, dtype="float16", mask="constraint"),
    Spec(batch=(2, 2), rows=40, keys=40, depth=128, width=80, dtype="bfloat16", shared_kv=True),
    Spec(batch=(2,), rows=70, keys=70, depth=64, width=64, dtype="float16", mask="cond"),  # score kernels
    Spec(batch=(2, 2), rows=50, keys=60, depth=32, width=32, dtype="bfloat16", scale_form="score",
         shared_kv=True),
])
def test_half_attention_gradient_runs_on_the_tensor_cores(spec):
    lib = _build(spec, gradient=True)
    assert len(lib.extra["names"]) == 2, "the gradient is two fused kernels"
    kernels = lib.source.split('extern "C" __global__')[1:]
    assert len(kernels) == 2 and all("mma.sync.aligned.m16n8k16" in k for k in kernels)


@pytest.mark.parametrize("spec, zigzag", [
    (Spec(batch=(10,), rows=2000, keys=2000, depth=64, width=64, dtype="float16", mask="constraint"), True),
    (Spec(batch=(40,), rows=2000, keys=2000, depth=64, width=64, dtype="float16", mask="constraint"), False),
    (Spec(batch=(3, 2), rows=500, keys=700, depth=64, width=64, dtype="float16"), False),
])
def test_work_groups_cover_every_row_block_and_head_once(spec, zigzag):
    """The forward's work-group order (``render_attention._Writer.row_block``), run in Python from
    the printed lines: each (row block, batch point) exactly once, longest first where causal."""
    import re

    src = _build(spec).source
    start = src.index("long grp = (long)get_group_id(0);")
    head = src[start:src.index("const long b", start)]
    assert ("the longest with the shortest" in head) == zigzag
    py = re.sub(r"/\*.*?\*/", "", head).replace("long grp = (long)get_group_id(0);", "")
    py = py.replace("const long ", "").replace(";", "\n").replace("/", "//")
    py = re.sub(r"if \((.*?)\) (.*)", r"if \1: \2", py)
    rows, heads = -(-spec.rows // 128), math.prod(spec.batch)
    seen = []
    for g in range(rows * heads):
        scope = {"grp": g}
        exec("\n".join(line.strip() for line in py.splitlines() if line.strip()), {}, scope)
        seen.append((scope["i0"], scope["grp"]))
    assert sorted(seen) == sorted((rb * 128, b) for rb in range(rows) for b in range(heads))
    if spec.mask == "constraint" and not zigzag:
        assert [i for i, _ in seen] == sorted((i for i, _ in seen), reverse=True), "longest (last) rows first"


def test_strict_mode_keeps_the_chain():
    lib = _build(Spec(batch=(2,), rows=64, keys=64, depth=64, width=64, dtype="float16"), strict=True)
    assert len(lib.extra["names"]) > 1 and "mma.sync" not in lib.source


def _cuda0():
    if "cuda.0" not in registry.devices():
        pytest.skip("no cuda.0 here (needs an NVIDIA GPU, its driver, cuda-bindings and NVRTC)")


GPU_SPECS = [
    Spec(batch=(2, 3), rows=100, keys=100, depth=64, width=64, dtype="float16", mask="constraint"),
    Spec(batch=(3,), rows=200, keys=200, depth=128, width=128, dtype="bfloat16", mask="constraint"),
    Spec(batch=(4,), rows=70, keys=33, depth=128, width=96, dtype="bfloat16"),
    Spec(batch=(2,), rows=9, keys=9, depth=5, width=3, dtype="float16", shared_kv=True, mask="constraint"),
    Spec(batch=(2, 2), rows=130, keys=130, depth=40, width=24, dtype="float16", scale=2.0, shared_kv=True),
    Spec(batch=(), rows=300, keys=300, depth=32, width=32, dtype="float16", scale_form="div",
         normalized=True),
    Spec(batch=(2,), rows=100, keys=90, depth=64, width=64, dtype="float16", bias=True),
    Spec(batch=(2, 2), rows=150, keys=150, depth=128, width=64, dtype="bfloat16", mask="cond"),
    Spec(batch=(10,), rows=2000, keys=2000, depth=64, width=64, dtype="float16", mask="constraint"),  # paired
]


GRADIENT_SCORES = Spec(batch=(2, 2), rows=90, keys=110, depth=64, width=48, dtype="float16",
                       scale_form="score", shared_kv=True, mask="cond")


@pytest.mark.parametrize("spec", GPU_SPECS)
def test_tensor_core_attention_matches_float64(spec):
    import tile

    _cuda0()
    ins = inputs(spec, seed=3)
    f = tile.compile(source(spec), device="cuda.0")
    got = np.asarray(f(**ins)["O"], np.float64)
    assert_close(spec, ins, got, reference(spec, ins))


@pytest.mark.parametrize("spec", [*GPU_SPECS[:4], *GPU_SPECS[6:8], GRADIENT_SCORES])
def test_tensor_core_attention_gradient_matches_float64(spec):
    import tile

    _cuda0()
    ins = gradient_inputs(spec, seed=5)
    f = tile.compile(gradient_source(spec), device="cuda.0")
    got = {k: np.asarray(v, np.float64) for k, v in f(**ins).items()}
    assert_gradients_close(spec, ins, got, gradient_reference(spec, ins))
