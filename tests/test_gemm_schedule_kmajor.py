"""``kmajor`` (``backends.cuda.kmajor``) on GEMMs whose groups hold several indexes: a 3xtf32
convolution on a device that launches kernels through CUDA used to fail in the pass (it unpacked
one index per group before asking whether the GEMM streams); it is left to the warp-level
kernel, which splits its operands itself."""

from __future__ import annotations

import numpy as np
import pytest

from backends.cuda.kmajor import COPY_TAG
from stripe.ir import walk
from stripe.passes.gemm_tile import SPLIT_TAG
from tests.test_tensorize import PADDED_CONV, VALID_CONV, plans
from tests.test_tma import optimized


@pytest.mark.parametrize("src,shapes", [
    (VALID_CONV, {"I": (8, 34, 34, 64), "F": (3, 3, 64, 128)}),
    (PADDED_CONV, {"I": (8, 32, 32, 64), "F": (3, 3, 64, 128)}),
], ids=["valid", "padded"])
def test_a_3xtf32_convolution_is_left_to_the_warp_level_kernel(src, shapes):
    p, _ = optimized(src, shapes, np.float32, precision="3xtf32")
    assert not any(COPY_TAG in b.tags or SPLIT_TAG in b.tags for b in walk(p))
    (plan,) = plans(p)
    assert plan.unit == "tensor_core.3xtf32" and plan.rm != 16  # not the warp-group tile
