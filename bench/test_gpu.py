"""``opencl_gpu.0`` at the sizes where a GPU is worth using, against PyTorch CUDA in the same run
(fp32, TF32 off): matmul 1024-8192, 3x3 convolutions of batch 8 and 32 (56x56x64 -> 64), a global
sum and row sums over 16M elements, an elementwise chain over 16M elements.

Each case is measured two ways, each against PyTorch measured the same way:

* ``kernel``: inputs already on the device (``tile.tensor``), the output written into a resident
  tensor (``out=``), timed to its completion: kernel time plus launch overhead. PyTorch: the op on
  CUDA tensors, then ``torch.cuda.synchronize()``.
* ``call``: numpy in, numpy out, every copy included, as ``exe(inputs)`` does by default.
  PyTorch: ``torch.from_numpy(...).cuda()``, the op, ``.cpu().numpy()``.

Besides, the notes record each kernel's time by the device's own profiling events
(``Executable.profile()``) and the rate of the kernels alone (``device_rate``).

Skips, with the reason, when there is no ``opencl_gpu.0`` (``TILE_BENCH_GPU`` names another
device); records no ratio when torch or CUDA is absent. Answers are checked (small-integer inputs
where sums are involved: exact in any order).

Run: ``python -m pytest bench/test_gpu.py --benchmark-only --benchmark-json=GPU.json``, then
``python -m bench report GPU.json``; ``--tile-config NAME`` optimizes with another config,
``--tile-tune`` autotunes first (the tuning is not part of the compile time's meaning then: it
includes the timed candidates).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import tile
from bench.cases import (
    CHAIN,
    CONV3X3,
    MATMUL,
    Case,
    Family,
    _floats,
    _ints,
    _torch_chain,
    _torch_conv,
    best_of,
    chain_ref,
    conv_nhwc,
    rounds_for,
)
from bench.gpu_kernels import torch_cuda

GPU = os.environ.get("TILE_BENCH_GPU", "opencl_gpu.0")
M16 = 4096  # 4096 x 4096 = 16M elements
SUM_ALL = "function (X[M, N]) -> (S) { S[] = +(X[i, j]); }"
ROW_SUM = "function (X[M, N]) -> (S) { S[i: M] = +(X[i, j]); }"


def _gb(x, out_elems: int) -> float:
    return sum(v.nbytes for v in x.values()) + 4 * out_elems


FAMILIES = (
    Family(
        "gpu_matmul", MATMUL,
        lambda n, r: {"A": _ints(r, n, n), "B": _ints(r, n, n)},
        lambda x: x["A"] @ x["B"],
        lambda x: 2 * x["A"].shape[0] ** 3,
        "GFLOP/s", "n (n×n times n×n)", (), (1024, 2048, 4096, 8192),
        terms=lambda x: x["A"].shape[1],
        torch=lambda d: lambda: d["A"] @ d["B"],
    ),
    Family(
        "gpu_conv3x3", CONV3X3,
        lambda b, r: {"I": _ints(r, b, 56, 56, 64), "K": _ints(r, 3, 3, 64, 64)},
        lambda x: conv_nhwc(x["I"], x["K"]),
        lambda x: 2 * x["I"].size * 9 * 64,
        "GFLOP/s", "batch (B×56×56×64, 3×3, 64 out, pad 1)", (), (8, 32),
        terms=lambda x: 9 * 64,
        torch=_torch_conv(1, 1),
        torch_nchw=True,
    ),
    Family(
        "gpu_sum_all", SUM_ALL,
        lambda n, r: {"X": _ints(r, n, n)},
        lambda x: np.asarray(x["X"].sum(dtype=np.float64), np.float32),
        lambda x: _gb(x, 1),
        "GB/s", "n (sum of an n×n matrix)", (), (M16,),
        terms=lambda x: x["X"].size,
        torch=lambda d: lambda: d["X"].sum(),
    ),
    Family(
        "gpu_row_sum", ROW_SUM,
        lambda n, r: {"X": _ints(r, n, n)},
        lambda x: x["X"].sum(axis=1),
        lambda x: _gb(x, x["X"].shape[0]),
        "GB/s", "n (row sums of an n×n matrix)", (), (M16,),
        terms=lambda x: x["X"].shape[1],
        torch=lambda d: lambda: d["X"].sum(dim=1),
    ),
    Family(
        "gpu_eltwise_chain", CHAIN,
        lambda n, r: {"X": _floats(r, n)},
        lambda x: chain_ref(x["X"]),
        lambda x: _gb(x, x["X"].size),
        "GB/s", "elements (relu(2x+1) / (1 + exp(-x)))", (), (M16 * M16,),
        torch=_torch_chain,
    ),
)
CASES = [Case(f, n) for f in FAMILIES for n in f.compiled_sizes]
MODES = ("kernel", "call")


def _gpu_or_skip():
    from backends import registry

    if GPU not in registry.devices():
        why = registry.unavailable() or "not registered"
        pytest.skip(f"no {GPU} here ({why}); the GPU benchmarks need an OpenCL GPU")



def _torch_runs(torch, case: Case, inputs: dict):
    """PyTorch's ``kernel`` run (resident tensors, synchronized) and ``call`` run (copies both
    ways), each returning the output as numpy in Tile's layout."""
    dev = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    fn = case.family.torch(dev)

    def layout(t):
        return (t.permute(0, 2, 3, 1) if case.family.torch_nchw else t).contiguous()

    def kernel():
        out = fn()
        torch.cuda.synchronize()
        return out

    def call():
        fresh = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
        return layout(case.family.torch(fresh)()).cpu().numpy()

    return kernel, call, lambda: layout(kernel()).cpu().numpy()


def _want(case: Case, inputs: dict, torch_answer):
    """The expected output: PyTorch's where it ran (the host is slow at these sizes), else numpy."""
    return torch_answer() if torch_answer is not None else case.reference(inputs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gpu(benchmark, case: Case, mode: str, request):
    _gpu_or_skip()
    from bench.cases import record, require_timing

    require_timing(benchmark)

    inputs = case.inputs()
    torch = torch_cuda()
    t_kernel = t_call = answer = None
    if torch is not None:
        t_kernel, t_call, answer = _torch_runs(torch, case, inputs)
    t0 = time.perf_counter()
    settings = {"cache": False, "tune": request.config.getoption("--tile-tune")}
    config = request.config.getoption("--tile-config")
    if config:
        settings["config"] = config
    exe = tile.compile(case.family.source, GPU, settings)
    (name,) = exe(inputs).keys()  # the first call compiles for these shapes
    compile_s = time.perf_counter() - t0
    want = _want(case, inputs, answer)
    if mode == "kernel":
        resident = {k: tile.tensor(v, GPU) for k, v in inputs.items()}
        out = tile.empty(want.shape, np.float32, GPU)

        def run():
            exe(resident, out={name: out})
            out.wait()
            return out
    else:
        def run():
            return exe(inputs)[name]

    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    got = benchmark.pedantic(run, rounds=rounds_for(once), warmup_rounds=1)
    case.check(got.numpy() if mode == "kernel" else got, want, inputs)
    ours = benchmark.stats.stats.min
    profile = exe.profile()  # the last timed call's kernels, by the device's own clock
    device_s = sum(secs for _, secs in profile)
    references = {}
    if torch is not None:
        ref = t_kernel if mode == "kernel" else t_call
        ref()
        references[f"pytorch_{mode}"] = best_of(ref, least=5)
    notes = {
        "mode": mode,
        "reference": "pytorch (TF32 off)" if torch is not None else "none: no torch+CUDA",
        "config": config or "the device's",
        "tuned": bool(settings["tune"]),
        # kernels alone (profiling events), without launch overhead or copies
        "device_rate": f"{case.work(inputs) / max(device_s, 1e-12) / 1e9:.4g} {case.family.unit}",
        "kernels": "; ".join(f"{name} {secs * 1e3:.3f} ms" for name, secs in profile),
    }
    if references:
        record(benchmark, case, GPU, inputs, ours, compile_s, references, notes)
    else:
        rate = case.work(inputs) / ours / 1e9
        benchmark.extra_info.update({"case": case.family.name, "size": case.size, "target": GPU,
                                     "rate": rate, "unit": case.family.unit, "compile_s": compile_s,
                                     "size_desc": case.family.size_desc, **notes})
        print(f"\n{GPU} {case.id} {mode}: {rate:.3g} {case.family.unit} (no PyTorch reference); "
              f"kernels alone {notes['device_rate']}")
