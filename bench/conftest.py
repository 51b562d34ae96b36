"""Benchmark setup: the ``--target`` option (default: every compiled device) and ``--threads``
(the thread counts each case runs at; numpy's BLAS gets the same count as Tile in every
measurement, through threadpoolctl)."""

import argparse
import os


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
        "--threads",
        default="1,all",
        help="comma-separated thread counts for CPU targets, 'all' = the device's pool "
        "(TILE_NUM_THREADS or one per core); numpy is limited to the same count (default 1,all)",
    )
    parser.addoption(
        "--tile-tune",
        action="store_true",
        help="bench/test_gpu.py: autotune (settings tune=True) before timing",
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
    if "threads" in metafunc.fixturenames:
        every = os.cpu_count() or 1
        try:
            from backends.llvm.device import env_threads

            every = env_threads() or every
        except ImportError:
            pass
        counts = []
        for word in str(metafunc.config.getoption("--threads")).split(","):
            n = every if word.strip() == "all" else int(word)
            if n not in counts:
                counts.append(n)
        metafunc.parametrize("threads", counts, ids=[f"t{n}" for n in counts])
        from bench.test_backends import THREAD_COUNTS

        THREAD_COUNTS[metafunc.config] = counts
