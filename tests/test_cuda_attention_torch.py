"""``tile.torch.op`` of the plain attention program on ``cuda.0`` (issue 41, "Through PyTorch"): the
forward runs the one fused tensor-core kernel, the backward the gradient's two, with nothing else
launched that materializes S or its row statistics, and the results are within
``conformance.attention``'s tolerances of float64. Needs an NVIDIA GPU with torch's CUDA (the
kernels are read off torch's profiler, which lists every kernel on the device, Tile's included).
"""

from __future__ import annotations

import numpy as np
import pytest

from backends import registry
from conformance.attention import (
    Spec,
    assert_close,
    assert_gradients_close,
    gradient_inputs,
    gradient_reference,
    reference,
    source,
)

SPECS = [
    Spec(batch=(2, 4), rows=256, keys=256, depth=64, width=64, dtype="float16", mask="constraint"),
    Spec(batch=(3,), rows=200, keys=130, depth=128, width=128, dtype="bfloat16"),
]


def _torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    if "cuda.0" not in registry.devices():
        pytest.skip("no cuda.0 here (needs an NVIDIA GPU, its driver, cuda-bindings and NVRTC)")
    return torch


def _kernels(torch, run) -> list[str]:
    """The names of the GPU kernels ``run()`` launches (torch's profiler: CUPTI sees every launch)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name
            and "Memset" not in e.name]


@pytest.mark.parametrize("k", range(len(SPECS)))
def test_tile_torch_attention_runs_the_fused_kernels(k):
    torch = _torch()
    import tile.torch as tt

    spec = SPECS[k]
    attention = tt.op(source(spec), name=f"cuda_attention_fused_{k}")
    ins = gradient_inputs(spec, seed=11)
    half = torch.float16 if spec.dtype == "float16" else torch.bfloat16

    def cuda(name: str, grad: bool):
        return torch.tensor(ins[name].astype(np.float32)).to("cuda", half).requires_grad_(grad)

    q, k_, v = cuda("Q", True), cuda("K", True), cuda("V", True)
    do = cuda("DO", False)
    attention(q, k_, v)  # compiles both programs' first shapes outside the profiled calls
    out = {}

    def forward():
        out["O"] = attention(q, k_, v)

    def backward():
        out["O"].backward(do)

    fwd, bwd = _kernels(torch, forward), _kernels(torch, backward)
    tile_fwd = [n for n in fwd if n.startswith("tile_")]
    assert len(tile_fwd) == 1 and "attention" in tile_fwd[0], fwd
    tile_bwd = [n for n in bwd if n.startswith("tile_")]  # the gradient's parts dq and dkv ("special")
    assert len(tile_bwd) == 2, bwd
    assert not any("contract" in n or "_max" in n or "_sum" in n for n in fwd + bwd), (fwd, bwd)
    assert_close(spec, ins, out["O"].detach().float().cpu().numpy(), reference(spec, ins))
    got = {"DQ": q.grad, "DK": k_.grad, "DV": v.grad}
    assert_gradients_close(spec, ins, {n: g.float().cpu().numpy() for n, g in got.items()},
                           gradient_reference(spec, ins))
