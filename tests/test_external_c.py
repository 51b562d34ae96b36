"""The C sample backend (examples/external_c/stripe_backend.c): built with the system C compiler and
run for real over the tile-external protocol, as ``external:./stripe_backend`` (stage ``stripe``,
and ``optimized`` with a config) and behind ``python -m tile serve`` (which serves it as its
device), every answer compared with the interpreter on integer-valued inputs (exact)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import registry
from tile.errors import TileBackendError

SOURCE = Path(__file__).resolve().parent.parent / "examples" / "external_c" / "stripe_backend.c"
CC = os.environ.get("CC", "cc")

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
PROGRAMS = {
    "matmul": (MATMUL, {"A": ((5, 7), np.float32), "B": ((7, 9), np.float32)}),
    "select": (
        "function (A[N], B[N]) -> (O) { O = A > B ? A - 1 : as_float(B, 32) / 2; }",
        {"A": ((6,), np.float32), "B": ((6,), np.float32)},
    ),
    "window": (
        "function (I[N]) -> (O) { O[x: N] = +(I[x + k - 1]), k < 3; }",
        {"I": ((7,), np.float32)},
    ),
    "rowmax_and_min": (
        "function (A[N, M]) -> (O, P) { O[i: N] = >(A[i, j]); P[j: M] = <(A[i, j]); }",
        {"A": ((3, 4), np.float32)},
    ),
    "integer_division": (
        "function (A[N], B[N]) -> (Q, R, S) { Q = A / B; R = mod(A, B); S[i: N] = =(A[N - 1 - i]); }",
        {"A": ((8,), np.int32), "B": ((8,), np.int32)},
    ),
    "bool_int64_float64": (
        "function (A[N], B[N]) -> (O, P, Q) "
        "{ O = A > B; P = as_float(A, 64) * 2.5; Q = A * B + index(A, 0); }",
        {"A": ((5,), np.int64), "B": ((5,), np.int64)},
    ),
}


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> str:
    """The built sample (a path), or a skip when there is no C compiler."""
    if shutil.which(CC) is None:
        pytest.skip(f"no C compiler ('{CC}' is not on PATH; set CC to use another)")
    exe = tmp_path_factory.mktemp("external_c") / "stripe_backend"
    cmd = [CC, "-std=c99", "-O2", "-Wall", "-o", str(exe), str(SOURCE), "-lm"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return str(exe)


@pytest.fixture
def target_of():
    """Ids given to ``tile.compile`` in a test: their processes are closed after it."""
    ids: list[str] = []

    def make(command: str) -> str:
        ids.append(f"external:{command}")
        return ids[-1]

    yield make
    for i in ids:
        registry.get(i).close()


def inputs_for(shapes: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.integers(-4, 5, size=s).astype(dt) for k, (s, dt) in shapes.items()}


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_array_equal(g, w, err_msg=k)


def test_the_sample_answers_as_the_interpreter_at_the_stripe_stage(backend, target_of):
    target = target_of(shlex.quote(backend))
    starts = registry.get(target).starts
    for src, shapes in PROGRAMS.values():
        x = inputs_for(shapes)
        assert_same(tile.compile(src, target)(x), tile.compile(src, "interp")(x))
    assert registry.get(target).starts - starts == 1  # one process served every program


@pytest.mark.parametrize("config", ["llvm_cpu", "opencl_gpu"])
def test_the_sample_runs_optimized_programs(backend, target_of, config):
    """Nested blocks, passthrough indexes, local allocations and renaming refinements."""
    target = target_of(f"{shlex.quote(backend)} --optimized {config}")
    for name in ("matmul", "window", "rowmax_and_min"):
        src, shapes = PROGRAMS[name]
        x = inputs_for(shapes, seed=1)
        assert_same(tile.compile(src, target)(x), tile.compile(src, "interp")(x))


def test_the_sample_runs_behind_tile_serve(backend, target_of):
    """``tile serve`` serves the sample as its device; this process talks to ``tile serve``."""
    serve = f"{shlex.quote(sys.executable)} -m tile serve --target {shlex.quote('external:' + backend)}"
    target = target_of(serve)
    x = inputs_for(PROGRAMS["matmul"][1], seed=2)
    assert_same(tile.compile(MATMUL, target)(x), tile.compile(MATMUL, "interp")(x))


def test_an_unsupported_program_is_a_failed_reply_and_the_sample_goes_on(backend, target_of):
    target = target_of(shlex.quote(backend))
    starts = registry.get(target).starts
    x = {"A": np.arange(3, dtype=np.float32)}
    with pytest.raises(TileBackendError, match="intrinsic 'exp'"):
        tile.compile("function (A[N]) -> (O) { O = exp(A); }", target)(x)
    y = inputs_for(PROGRAMS["matmul"][1])
    assert_same(tile.compile(MATMUL, target)(y), tile.compile(MATMUL, "interp")(y))
    assert registry.get(target).starts - starts == 1  # an error reply, not a crash
