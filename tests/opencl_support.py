"""Shared helpers of the OpenCL backend tests (``tests/test_opencl_*.py``); not a test module.

The tests run on ``$TILE_OPENCL_TEST_DEVICE`` if set, else on the first usable OpenCL device
(``opencl_cpu.0`` when there is one: PoCL), and skip, with the registry's reason, when there is
none. float16 needs no ``cl_khr_fp16`` (it is stored through the core ``vload_half``/
``vstore_half_rte``), so its paths are checked on every device.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.driver import compile_bound
from stripe.config import format_config, parse_config
from tests.llvm_runner import assert_same
from tile.bind import bind
from tile.inputs import input_types


def _device_id() -> str | None:
    ids = [d for d in registry.devices() if d.startswith("opencl_")]
    asked = os.environ.get("TILE_OPENCL_TEST_DEVICE")
    if asked:
        return asked if asked in ids else None
    return "opencl_cpu.0" if "opencl_cpu.0" in ids else (ids[0] if ids else None)


DEVICE_ID = _device_id()
_WHY = {k: v for k, v in registry.unavailable().items() if k.startswith("opencl")}
requires_opencl = pytest.mark.skipif(
    DEVICE_ID is None, reason=f"no usable OpenCL device: {_WHY or 'none registered'}"
)


def device():
    return registry.get(DEVICE_ID)


def run(src: str, inputs: dict, dev=None, settings: dict | None = None) -> dict:
    """``src`` on ``dev`` (default: ``tile.compile`` for the test device id)."""
    if dev is None:
        return tile.compile(src, DEVICE_ID, settings)(inputs)
    prog = tile.parse(src)
    return compile_bound(bind(prog, input_types(prog, inputs)), dev, settings)(inputs)


def check(src: str, inputs: dict, dev=None, settings: dict | None = None, ulps: int = 0) -> dict:
    """The device's outputs equal the Tile interpreter's (exactly, or within ``ulps``)."""
    got = run(src, inputs, dev, settings)
    assert_same(got, ref_interp.run(src, inputs), ulps)
    return got


def ints(rng: np.random.Generator, shape, lo=-3, hi=4, dtype=np.float32) -> np.ndarray:
    return rng.integers(lo, hi, shape).astype(dtype)


__all__ = [
    "DEVICE_ID",
    "assert_same",
    "check",
    "device",
    "ints",
    "requires_opencl",
    "run",
]


H100 = 132 * 1024  # the H100's parallelism: 132 compute units x 1024 work-items


def h100_config(tmp_path_factory, one_kernel: bool = True) -> str:
    """opencl_gpu.json with the H100's parallelism in its split step (so the local device splits
    as the H100 does) and ``one_kernel`` on or off; the file's path."""
    split = {"parallelism": H100, "one_kernel": one_kernel}
    data = {"extends": "opencl_gpu", "name": "opencl_gpu", "params": {"split_reductions": split}}
    path = tmp_path_factory.mktemp("cfg") / f"opencl_gpu_h100_{one_kernel}.json"
    path.write_text(format_config(parse_config(json.dumps(data))))  # every step written out
    return str(path)
