"""Code generations per kernel over a sweep of sequence lengths (issue 40: at most 4 per kernel).

The attention forward (``bench.compile_time.ATTENTION``) under the ``generic`` setting, on two
threads (the thread split is part of a kernel's code, and the host's core count must not decide the
count), the object cache off so that every build generates; a kernel known across lengths by
``bench.generic_shapes.kernel_of`` (its kind and the buffers it writes).
"""

from __future__ import annotations

import numpy as np

import tile
from backends.llvm import generic
from bench.compile_time import ATTENTION
from bench.generic_shapes import generated_kernels, kernel_of
from tests.generic_support import assert_attention_close, fresh_registry  # noqa: F401

SETTINGS = {"generic": True, "cache": False, "threads": 2}
# the short lengths (flat plain loops), the order flip of P V at 2 x threads, the first products
# past the flat lengths, the nest's M tile passing 128 (150), two and three panels of 64 floats
LENGTHS = [1, 2, 3, 4, 5, 6, 9, 17, 33, 64, 72, 80, 96, 120, 136, 150, 187, 234, 292]


def _inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.integers(-2, 3, size=s).astype(np.float32) for s in [(n, 8), (n, 8), (n, n), (n, 8)]]


def generations(lengths) -> dict[str, list[int]]:
    """Kernel -> the lengths at which code was generated for it (specialized or generic)."""
    exe = tile.compile(ATTENTION, "llvm_cpu.0", SETTINGS)
    out: dict[str, list[int]] = {}
    for n in lengths:
        args = _inputs(n)
        assert_attention_close(exe(*args)["O"], *args)
        for info in generated_kernels(exe._last.library):
            out.setdefault(kernel_of(info), []).append(n)
    return out


def test_at_most_four_generations_per_kernel():
    gens = generations(LENGTHS)
    assert gens, "nothing generated"
    worst = {k: v for k, v in gens.items() if len(v) > 4}
    assert not worst, f"kernels generated more than 4 times: {worst}"


def test_no_generation_past_the_first_product_template():
    """Past the lengths that build the products' templates (72 and 80 here), no length generates
    code: not at 136 (three panels of 64 floats: the split over panels gave way to rows) nor at 150
    (the nest's M tile 256: the fused epilogue's accumulator strides)."""
    gens = generations([8, 16, 72, 80, 136, 150, 187, 264, 300])
    late = {k: [n for n in v if n > 80] for k, v in gens.items()}
    assert not any(late.values()), f"generated past S = 80: {late}"
    assert generic.REGISTRY.generated > 0


def test_the_first_long_length_builds_the_products_template():
    """Under ``generic`` a GEMM without a fused epilogue stays flat at every size (``gemm_tile``'s
    ``flat_unfused``), so a short length's ``P V`` is its product bucket's first kernel and the
    first longer length (72) builds the micro-kernel's template: no plain first kernel there. The
    fused ``Q K^T + R`` sums 8 points a result: flat at every length too (``flat_k``), its plain
    loops' template (from 3 and 8) serves 72, 80 and 136 (it was a nest past the short lengths:
    first 72, template 80)."""
    gens = generations([3, 8, 72, 80, 136])
    assert gens["matmul->O"] == [3, 8, 72], gens
    assert gens["matmul->M"] == [3, 8], gens


PV = "function (P[S, S], V[S, D]) -> (O) { O[i, d: S, D] = +(P[i, j] * V[j, d]); }"
DQ = "function (DM[S, S], K[S, D]) -> (DQ) { DQ[i, d: S, D] = +(DM[i, j] * K[j, d]); }"


def _product_inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.integers(-3, 4, size=s).astype(np.float32) for s in [(n, n), (n, 8)]]


def test_a_form_serves_another_programs_kernel_the_same_up_to_names():
    """The attention backward's ``dM K`` is the forward's ``P V`` with other names: once the first
    program built the product's template (at S = 72, its first kernel a short length's), the second
    program binds to it at 72 and 200 and generates nothing there; both exact (integer inputs)."""
    first = tile.compile(PV, "llvm_cpu.0", SETTINGS)
    second = tile.compile(DQ, "llvm_cpu.0", SETTINGS)
    for exe, out in ((first, "O"), (second, "DQ")):
        for n in (3, 72, 200):
            before = generic.REGISTRY.generated
            a, b = _product_inputs(n)
            np.testing.assert_array_equal(exe(a, b)[out], a @ b, err_msg=f"{out} at {n}")
            if exe is second and n > 64:
                assert generic.REGISTRY.generated == before, f"the second program generated code at {n}"
    assert generic.REGISTRY.generated >= 1
