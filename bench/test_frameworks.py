"""The framework bridges' cost (issue 25): a ``tile.torch`` op's per-call overhead on 1-element CPU
tensors over its kernel, and a training step of the small CNN of ``examples/torch_cnn.py`` against
the same model in pure PyTorch at the same thread count (``--threads``: Tile's ``threads`` setting
and ``torch.set_num_threads`` alike).

Run: ``python -m pytest bench/test_frameworks.py --benchmark-only -s`` (``-s`` shows a line per
case). Each case checks its answer; ``extra_info`` holds the microseconds: ``per_call_us`` (best
mean of a round of calls), ``kernel_us`` (the device's own kernel time, ``Executable.profile``),
``overhead_us`` (the difference), ``dispatcher_us`` (the same call through ``torch.ops.tile``, as
``torch.compile`` and tracing call it, instead of the eager shortcut), ``tile_call_us`` (the same
program through ``tile.compile`` on numpy arrays), ``torch_us`` (``torch.add``); for the CNN,
``step_ms`` of each and their ratio.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import registry

torch = pytest.importorskip("torch", reason="the tile.torch benchmarks need PyTorch")
pytestmark = pytest.mark.skipif("llvm_cpu.0" not in registry.devices(), reason="needs llvm_cpu.0")

ADD = "function (A[N], B[N]) -> (C) { C = A + B; }"
CALLS = 2000  # calls per round: a 1-element call takes tens of microseconds


def per_call(fn, rounds: int = 15, calls: int = CALLS) -> float:
    """Seconds per call: the best round's mean (rounds absorb a loaded machine's pauses)."""
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "requires_grad"])
def test_torch_op_overhead(benchmark, grad):
    """``requires_grad``: the input needs a gradient, so the call goes through the dispatcher and
    autograd (saving inputs for backward); ``no_grad`` calls skip the dispatcher."""
    op = tile.torch.op(ADD, name="bench_add")
    a, b = torch.ones(1, requires_grad=grad), torch.ones(1)
    assert torch.equal(op(a, b), a.detach() + b)
    exe = tile.compile(ADD)
    na, nb = a.detach().numpy(), b.numpy()
    kernels = []
    for _ in range(200):
        exe(A=na, B=nb)
        kernels.append(sum(s for _, s in exe.profile()))
    kernel = min(kernels)

    def call():
        return op(a, b)

    benchmark.pedantic(lambda: [call() for _ in range(CALLS)], rounds=5, warmup_rounds=1)
    seconds = min(benchmark.stats.stats.min / CALLS, per_call(call))
    dispatched = per_call(lambda: op.op(a, b))  # the registered operator, through the dispatcher
    tile_call = per_call(lambda: exe(A=na, B=nb))
    reference = per_call(lambda: torch.add(a, b))
    us = {
        "per_call_us": seconds * 1e6,
        "kernel_us": kernel * 1e6,
        "overhead_us": (seconds - kernel) * 1e6,
        "dispatcher_us": dispatched * 1e6,
        "tile_call_us": tile_call * 1e6,
        "torch_us": reference * 1e6,
    }
    benchmark.extra_info.update({k: round(v, 2) for k, v in us.items()})
    print(f"\ntile.torch 1-element add ({'requires_grad' if grad else 'no grad'}): "
          + ", ".join(f"{k} {v:.1f}" for k, v in us.items()))


def test_jax_op_overhead(benchmark):
    jax = pytest.importorskip("jax", reason="tile.jax needs JAX")
    import tile.jax

    op = jax.jit(tile.jax.op(ADD))
    a = jax.numpy.ones(1)
    assert np.array_equal(op(a, a), np.full(1, 2.0, np.float32))

    def call():
        return op(a, a).block_until_ready()

    benchmark.pedantic(lambda: [call() for _ in range(CALLS)], rounds=5, warmup_rounds=1)
    seconds = benchmark.stats.stats.min / CALLS
    plain = jax.jit(lambda x, y: x + y)
    reference = per_call(lambda: plain(a, a).block_until_ready())
    benchmark.extra_info.update({"per_call_us": round(seconds * 1e6, 2), "jax_us": round(reference * 1e6, 2)})
    print(f"\ntile.jax 1-element add under jit: {seconds * 1e6:.1f} us; "
          f"jax.jit(x + y): {reference * 1e6:.1f} us")


def _cnn():
    path = Path(__file__).resolve().parents[1] / "examples" / "torch_cnn.py"
    spec = importlib.util.spec_from_file_location("torch_cnn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("batch", [4, 32])
def test_cnn_training_step(benchmark, threads, batch):
    """One SGD step (forward, backward, update) of the CNN, float32, 8x8 images (batch 4: the
    test's size, all overhead; 32: more work per call)."""
    cnn = _cnn()
    x, t, params = cnn.data(batch=batch, dtype=torch.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ops = {k: tile.torch.op(v.core.text, name=f"{v.name}_t{threads}", settings={"threads": threads})
               for k, v in cnn.tile_layers().items()}
        ours = cnn.train(cnn.tile_loss, params, x, t, steps=3, ops=ops)
        theirs = cnn.train(cnn.torch_loss, params, x, t, steps=3)
        np.testing.assert_allclose(ours, theirs, rtol=1e-3)
        live = [p.detach().clone().requires_grad_() for p in params]

        def step(loss_fn, ops=None):
            loss = loss_fn(live, x, t, ops)
            grads = torch.autograd.grad(loss, live)
            with torch.no_grad():
                for p, g in zip(live, grads):
                    p -= 0.01 * g

        benchmark.pedantic(lambda: step(cnn.tile_loss, ops), rounds=20, warmup_rounds=2)
        tile_s = benchmark.stats.stats.min
        torch_s = min(per_call(lambda: step(cnn.torch_loss), rounds=5, calls=10), tile_s * 100)
    finally:
        torch.set_num_threads(before)
    benchmark.extra_info.update(
        {"step_ms": round(tile_s * 1e3, 3), "torch_step_ms": round(torch_s * 1e3, 3),
         "ratio": round(torch_s / tile_s, 3), "threads": threads, "batch": batch}
    )
    print(f"\nCNN step batch {batch}, {threads} thread(s): tile.torch {tile_s * 1e3:.2f} ms, "
          f"PyTorch {torch_s * 1e3:.2f} ms (ratio {torch_s / tile_s:.2f})")
