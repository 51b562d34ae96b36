"""Compiled targets on every case of ``bench/cases.py``, against a reference measured in the same
run: numpy on CPU targets, PyTorch (fp32, TF32 off) on GPU targets when torch has CUDA, and
PlaidML 0.7 besides where it imports. Records GFLOP/s or GB/s and the ratio (reference time /
target time; above 1 means faster than the reference). Compile time is measured apart.

Run: ``python -m pytest bench/ --benchmark-only [--target ID] [--benchmark-json=RUN.json]``
(default: every compiled device), then ``python -m bench report RUN.json``. ``--threads 1,all``
(the default) runs CPU targets at each count (``settings={"threads": n}``) with numpy's BLAS limited
to the same count in the same run; the table's target and reference say the count (``llvm_cpu.0 2t``,
``numpy 2t``). ``TILE_BENCH_BIG=1`` adds matmul 4096. ``--no-optimize``
compiles the lowered program without the target config's passes (to measure what they do);
``--tile-config NAME`` optimizes with another config (``llvm_cpu_tiled``, a file).
"""

from __future__ import annotations

import time

import pytest
from threadpoolctl import threadpool_limits

import tile
from bench.cases import (
    Case,
    Inputs,
    add_plaidml_reference,
    best_of,
    cases,
    record,
    require_timing,
    rounds_for,
)
from bench.gpu_kernels import torch_cuda

CASES = cases("compiled")
THREAD_COUNTS: dict = {}  # config -> the thread counts of this session (conftest fills it)


def _torch_reference(case: Case, inputs: Inputs):
    """The same computation in PyTorch on the GPU (TF32 off), or None when there is no CUDA
    (or the case has no PyTorch version)."""
    if case.family.torch is None:
        return None
    torch = torch_cuda()
    if torch is None:
        return None
    fn = case.family.torch({k: torch.from_numpy(v).cuda() for k, v in inputs.items()})

    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    run()
    return run


def _resident_seconds(exe, inputs: Inputs, target: str) -> float:
    """Best time of a call on inputs already in the device's memory, outputs left there: the
    kernels and their dispatch without the per-call copies a numpy-in, numpy-out call makes."""
    resident = {k: tile.tensor(v, device=target) for k, v in inputs.items()}

    def run():
        for t in exe(resident, resident=True).values():
            t.wait()

    run()
    return best_of(run)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_target(benchmark, target, case, threads, request):
    from backends import registry

    if target not in registry.devices():
        pytest.skip(f"device {target} unavailable: {registry.unavailable() or 'not registered'}")
    require_timing(benchmark)
    cpu = target.startswith("llvm_cpu")
    if not cpu and threads != max(THREAD_COUNTS.get(request.config, [threads])):
        pytest.skip(f"{target} has no thread setting: measured once, at the largest count")
    inputs = case.inputs()
    want = case.reference(inputs)
    t0 = time.perf_counter()
    optimized = not request.config.getoption("--no-optimize")
    settings = {"cache": False, "optimize": optimized}
    if cpu:
        settings["threads"] = threads
    config = request.config.getoption("--tile-config")
    if config:
        settings["config"] = config
    exe = tile.compile(case.family.source, target, settings)
    exe(inputs)  # the first call compiles for these shapes
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe(inputs)
    once = time.perf_counter() - t0
    out = benchmark.pedantic(lambda: exe(inputs), rounds=rounds_for(once), warmup_rounds=1)
    (got,) = out.values()
    case.check(got, want, inputs)
    ours = benchmark.stats.stats.min

    # A GPU target is compared with PyTorch on the GPU; everything else with numpy.
    references: dict[str, float] = {}
    torch_run = _torch_reference(case, inputs) if "gpu" in target else None
    if torch_run is not None:
        got = torch_run()
        case.check((got.permute(0, 2, 3, 1) if case.family.torch_nchw else got).cpu().numpy(), want, inputs)
        references["pytorch"] = best_of(torch_run, least=5)
    else:
        with threadpool_limits(threads):  # numpy's BLAS gets Tile's thread count
            references[f"numpy {threads}t"] = best_of(lambda: case.reference(inputs))
    notes = {"optimized": optimized, "config": config or "the device's", "threads": threads}
    if cpu:
        notes["resident_rate"] = case.work(inputs) / _resident_seconds(exe, inputs, target) / 1e9
    add_plaidml_reference(case, inputs, references, notes)
    label = f"{target} {threads}t" if cpu else target
    record(benchmark, case, label, inputs, ours, compile_s, references, notes)
