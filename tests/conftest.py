"""Fixtures shared by the test modules that ask for them (``pytest.mark.usefixtures``)."""

from __future__ import annotations

import os

import pytest

# Tests that check which thread ran which chunk need each worker to run its own: on a loaded
# machine a sleeping worker may wake later than a call waits before it runs a late worker's chunks
# itself (``backends.llvm.threads``, "A late worker's chunks"); tests/test_llvm_pool.py tests that.
os.environ.setdefault("TILE_THREAD_STEAL_US", str(10**9))


@pytest.fixture
def private_cache(request, tmp_path_factory, monkeypatch):
    """Compiled objects (LLVM) and program binaries (OpenCL) go to the test session's temporary
    directory, not the user's cache: ``opencl-cache`` for ``test_opencl_*`` modules, else ``llvm-cache``."""
    backend = "opencl" if "opencl" in request.module.__name__ else "llvm"
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / f"{backend}-cache"))


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=500,
        help="Hypothesis examples for each front-end fuzz test (tests/test_fuzz_frontend.py)",
    )
