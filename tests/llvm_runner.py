"""A tiny runner for the LLVM backend tests: lower, build, run every ``#main`` kernel, compare.

Not a test module: ``tests/test_llvm_*.py`` import it, and ``tests/test_opencl_stripe.py`` runs
its programs through ``build`` and ``execute`` on the OpenCL device. It drives the HAL exactly as
a runner does (one buffer per root refinement, inputs written through ``map_discard`` and
``unmap``, each kernel's ``run`` chained on the previous events) and compares with the Stripe
interpreter and the Tile interpreter.
"""

from __future__ import annotations

import numpy as np

import ref_interp
import tile
from backends.hal import KernelInfo, Library
from backends.llvm import LlvmCpuDevice
from backends.llvm.microkernel import kernel_match
from backends.options import BuildFacts, build_library
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, RefDir
from stripe.lower import lower
from tile.bind import bind
from tile.dtypes import BFLOAT16_NUMPY
from tile.inputs import input_types

DEVICE = LlvmCpuDevice()


def buffer_names(kernel: Block, roots: frozenset[str] | None = None) -> tuple[str, ...]:
    """The buffers a kernel uses, in order; with ``roots``, a kernel's own allocations are not one."""
    names: dict[str, None] = {}
    for r in kernel.refs:
        if roots is not None and r.from_ is None and r.dir is RefDir.NONE and r.into not in roots:
            continue
        names.setdefault(r.from_ or r.into)
    return tuple(names)


def lowered(src: str, inputs: dict) -> Block:
    p = tile.parse(src)
    return lower(bind(p, input_types(p, inputs)))


def contraction_match(src: str, inputs: dict, cfg, blocks=None):
    """``(kernel, match)``: the one ``contraction`` kernel of ``src`` lowered at ``inputs``, and the
    micro-kernel's match of it under the ``VectorConfig`` ``cfg`` and K ``blocks`` (None where
    ``kernel_match`` declines it)."""
    program = lowered(src, inputs)
    (kernel,) = [k for k in program.stmts[0].stmts if "contraction" in k.tags]
    dims = {r.into: r.shape.dims for r in kernel.refs}
    dts = {r.into: r.shape.dtype for r in kernel.refs}
    return kernel, kernel_match(None, kernel, dims, dts, None, cfg, blocks, None)


def small_ints(rng, *shape, dtype=np.float32):
    """Random integers in [-4, 4] of ``shape`` as ``dtype``: their products and sums are exact."""
    return rng.integers(-4, 5, shape).astype(dtype)


def build(program: Block, settings: dict | None = None, device=DEVICE) -> tuple[Library, list[KernelInfo]]:
    main = program.stmts[0]
    roots = frozenset(r.into for r in program.refs)
    infos = [KernelInfo(k.name, k, buffer_names(k, roots)) for k in main.stmts]
    facts = BuildFacts(buffer_dtypes={r.into: r.shape.dtype.value for r in program.refs})
    return build_library(device.compiler, infos, settings or {}, facts), infos


def execute(program: Block, inputs: dict, settings: dict | None = None, device=DEVICE, library=None):
    """Run ``program`` on the device; return (outputs by name, the prepared kernels)."""
    if library is None:
        library, infos = build(program, settings, device)
    infos = library.kernels
    ex = device.executor
    bufs, events = {}, []
    for r in program.refs:
        buf = ex.allocate(r.shape.elements * r.shape.dtype.numpy.itemsize)
        view = buf.map_discard()
        if r.into in inputs:
            arr = np.ascontiguousarray(np.asarray(inputs[r.into]).astype(r.shape.dtype.numpy))
            view[:] = arr.reshape(-1).view(np.uint8)
        events.append(buf.unmap(view))  # a done event for host buffers; the upload for OpenCL
        bufs[r.into] = buf
    kernels = [ex.prepare(library, i) for i in range(len(infos))]
    for info, k in zip(infos, kernels):
        events = [k.run([bufs[b] for b in info.buffers], events)]
    outs = {}
    for r in program.refs:
        if "output" in r.tags:
            raw = bufs[r.into].map_current(events)
            flat = raw.view(r.shape.dtype.numpy)[: r.shape.elements]
            outs[r.into] = flat.reshape(r.shape.sizes).copy()
    return outs, kernels


def assert_same(got: dict, want: dict, ulps: int = 0) -> None:
    """Equal dtypes, shapes and values (nan equal to nan); floats within ``ulps`` units in the last
    place of the expected value when ``ulps`` is given (for libm functions)."""
    assert set(got) == set(want)
    for k in want:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        if w.dtype == BFLOAT16_NUMPY:  # (kind "V": numpy would not match nan with nan)
            g, w = g.astype(np.float32), w.astype(np.float32)
        if ulps == 0 or w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=k)
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{k}: nan positions")
        np.testing.assert_array_equal(g[np.isinf(w)], w[np.isinf(w)], err_msg=f"{k}: infinities")
        fin = np.isfinite(w)
        gap = np.abs(g[fin].astype(np.float64) - w[fin].astype(np.float64))
        unit = np.spacing(np.abs(w[fin])).astype(np.float64)
        assert (gap <= ulps * unit).all(), (k, float((gap / unit).max()), ulps)


def check(src: str, inputs: dict, settings: dict | None = None, ulps: int = 0) -> dict:
    """The device's outputs equal the Stripe interpreter's and the Tile interpreter's."""
    program = lowered(src, inputs)
    got, _ = execute(program, inputs, settings)
    assert_same(got, run_stripe(program, inputs), ulps)
    assert_same(got, ref_interp.run(src, inputs), ulps)
    return got
