"""Benchmark setup: BLAS threads pinned so reference timings are comparable run to run, and the
``--target`` option (default: every compiled device)."""

import argparse
import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")


def pytest_addoption(parser):
    try:
        parser.addoption("--target", action="append", default=[], help="device id(s) to benchmark")
    except (ValueError, argparse.ArgumentError):
        pass  # conformance/conftest.py defines the same option when both folders run together
    parser.addoption(
        "--tile-config",
        metavar="NAME_OR_FILE",
        help="optimize with this config (a built-in name such as llvm_cpu_tiled, or a file)",
    )
    parser.addoption(
        "--no-optimize",
        action="store_true",
        help="compile the lowered Stripe as it is, without the target config's passes (to see what they do)",
    )


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        from backends import registry

        asked = metafunc.config.getoption("--target") or list(registry.devices()) or ["llvm_cpu.0"]
        metafunc.parametrize("target", asked)
