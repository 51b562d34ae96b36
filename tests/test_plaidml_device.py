"""``plaidml.llvm_cpu.0``: PlaidML 0.7.0 as a ``tile.devices`` plugin (``backends/plaidml``).

Without PlaidML (the default environment) the entry point costs nothing and says why, with the
install command, in ``python -m tile devices`` and in the error of ``tile.compile``; those tests
also run where PlaidML is installed, by hiding it. The tests that run programs on PlaidML skip,
with the reason, where PlaidML 0.7.0 is not installed or does not work. ``known_difference``
needs no PlaidML: it reads the program and its inputs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.hal import Found
from backends.plaidml import worker
from backends.plaidml.device import PlaidMLDevice, outcome_of, plaidml_source
from tile import cli
from tile.errors import TileBackendError, TileIndexError

ROOT = Path(__file__).resolve().parent.parent
ID = "plaidml.llvm_cpu.0"
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


@pytest.fixture
def hidden(monkeypatch):
    """PlaidML as if not installed, whatever is installed here; no process may start."""
    find_spec = importlib.util.find_spec

    def no_plaidml(name, *args, **kwargs):
        return None if name == "plaidml" else find_spec(name, *args, **kwargs)

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started to list an absent PlaidML")

    monkeypatch.setattr(importlib.util, "find_spec", no_plaidml)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(worker, "_why_unavailable", [])
    registry.reset()
    yield
    registry.reset()


def test_the_entry_point_says_why_and_starts_nothing(hidden):
    found = __import__("backends.plaidml", fromlist=["devices"]).devices()
    assert isinstance(found, Found) and list(found) == []
    assert "not installed" in found.unavailable["plaidml"] and worker.INSTALL in found.unavailable["plaidml"]


def test_devices_lists_it_as_unavailable_with_the_install_command(hidden, capsys):
    assert cli.main(["devices", "--fresh"]) == 0  # probed here, with PlaidML hidden: not the kept listing
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("plaidml"))
    assert line.startswith("plaidml.*") and "unavailable" in line and worker.INSTALL in line


def test_compiling_for_it_says_why(hidden):
    with pytest.raises(tile.TileDeviceError, match="plaidml 0.7.0 is not installed") as info:
        tile.compile(MATMUL, ID)
    assert worker.INSTALL in info.value.message


@pytest.mark.skipif(worker.not_installed() is None, reason="PlaidML 0.7.0 is installed in this environment")
def test_python_m_tile_devices_without_plaidml():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tile", "devices"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "plaidml.*" in out.stdout and "unavailable" in out.stdout and worker.INSTALL in out.stdout


# ------------------------------------------------------------------------------ what it sends


def test_it_groups_every_operation_so_precedence_cannot_differ():
    """§10.22: PlaidML binds `|` tighter than `^`; parentheses mean the same in both."""
    src = plaidml_source(tile.parse("function (A, B, C) -> (O) { O = A | B ^ -C * 2 ? -1 : A; }"))
    assert "O = ((A | (B ^ (-(C) * 2))) ? (-1) : A);" in src
    prog = tile.parse(src)
    assert tile.parse(src) == prog  # still Tile, which our parser reads


# ------------------------------------------------------------------------------ known differences

I32 = np.array([-1, 2], np.int32)


ABORT = "plaidml.llvm_cpu.0 raised TileBackendError: plaidml.llvm_cpu.0: PlaidML abort: the process died"
F32 = np.ones(2, np.float32)
NAMED = {
    "10.12-relu": (
        "O = relu(A);",
        {"A": I32},
        "answered float32[2] for output 'O'; the program makes int32[2]",
    ),
    "10.12-exp": ("O = exp(A);", {"A": I32}, ABORT),
    "10.39": ("O = as_bool(A);", {"A": np.array([2], np.int32)}, "O: 1 of 1 elements differ"),
    "10.1": ("O[2*i: 2*N] = *(A[i]);", {"A": F32}, "O: 2 of 4 elements differ"),
    "10.41": ("O[] = +(A[i]);", {"A": np.array([True, False])}, ABORT),
    "10.6": ("O[i: 0] = +(A[i]);", {"A": F32}, ABORT),
    "10.20": ("O = N;", {"A": F32}, ABORT),
}


@pytest.mark.parametrize("section", list(NAMED))
def test_a_documented_difference_is_named(section):
    body, inputs, problem = NAMED[section]
    source = f"function (A[N]) -> (O) {{ {body} }}"
    reason = PlaidMLDevice().known_difference(source, problem, inputs)
    assert reason is not None and reason.startswith(f"semantics §{section.split('-')[0]}:"), reason


def test_a_difference_explains_only_what_it_shows():
    """An abort is not explained by a float literal PlaidML reads as float32 (§10.13), nor a wrong
    value by an abort PlaidML may have on other programs; an agreeing program has no difference."""
    dev, x = PlaidMLDevice(), {"A": np.ones(2)}
    literal = "function (A) -> (O) { O = A * 0.1; }"
    assert dev.known_difference(literal, "O: 2 of 2 elements differ", x).startswith("semantics §10.13:")
    assert dev.known_difference(literal, ABORT, x) is None
    assert (
        dev.known_difference("function (A) -> (O) { O = exp(A); }", "O: 1 of 2 elements differ", {"A": I32})
        is None
    )
    square = {"A": np.ones((2, 2)), "B": np.ones((2, 2))}
    assert dev.known_difference(MATMUL, "C: 1 of 4 elements differ", square) is None


def test_outcome_of_reads_the_problem():
    assert (
        outcome_of("raised TileBackendError: plaidml.llvm_cpu.0: PlaidML hang: no result within 3 s")
        == "hang"
    )
    assert outcome_of("O: expected int32[2], got float32[2]") == "dtype"
    assert outcome_of("O: 1 of 2 elements differ: O[0]: expected 1, got 2") == "values"
    assert outcome_of("something else") is None


# ------------------------------------------------------------------------------ on PlaidML


@pytest.fixture(scope="module")
def plaidml():
    why = worker.unavailable()
    if why is not None:
        pytest.skip(why)
    dev = registry.get(ID)
    yield dev
    dev.close()


def _ints(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).integers(-3, 4, shape).astype(dtype)


def test_it_is_listed(plaidml):
    assert isinstance(plaidml, PlaidMLDevice) and ID in registry.ids()
    out = subprocess.run([sys.executable, "-m", "tile", "devices"], capture_output=True, text=True)
    assert any(ln.startswith(ID) and "takes tile programs" in ln for ln in out.stdout.splitlines()), (
        out.stdout
    )


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_a_matrix_product_equals_the_interpreter(plaidml, dtype):
    ins = {"A": _ints(4, 5, dtype=dtype), "B": _ints(5, 3, dtype=dtype, seed=1)}
    got = tile.compile(MATMUL, ID)(ins)
    want = ref_interp.run(MATMUL, ins)
    assert got["C"].dtype == want["C"].dtype and np.array_equal(got["C"], want["C"])


A3 = np.array([1, 2, 3], np.float32)
AS_WE_MEAN = {
    "precedence": ("O = A | B ^ C;", {"A": I32, "B": I32 + 2, "C": I32 * 3}),  # §10.22
    "size-input": ("O[i: S] = +(A[i]);", {"A": A3, "S": np.int32(5)}),  # §10.43
    "size-in-reshape": ("O = reshape(A, S, 1);", {"A": A3, "S": np.int32(3)}),
}


@pytest.mark.parametrize("name", list(AS_WE_MEAN))
def test_programs_it_reads_as_we_mean_them(plaidml, name):
    """§10.22: precedence; §10.43: a 0-D size input is bound as a plaidml.Integer."""
    body, inputs = AS_WE_MEAN[name]
    source = f"function ({', '.join(inputs)}) -> (O) {{ {body} }}"
    got, want = tile.compile(source, ID)(inputs), ref_interp.run(source, inputs)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_an_abort_is_a_backend_error_and_the_next_call_runs(plaidml):
    with pytest.raises(TileBackendError, match=f"{ID}: PlaidML abort") as info:
        tile.compile("function (A) -> (O) { O = exp(A); }", ID)({"A": I32})
    assert plaidml.known_difference("function (A) -> (O) { O = exp(A); }", str(info.value)).startswith(
        "semantics §10.12:"
    )  # the inputs of the last call of that program
    ins = {"A": _ints(2, 2), "B": _ints(2, 2, seed=1)}
    assert np.array_equal(tile.compile(MATMUL, ID)(ins)["C"], ins["A"] @ ins["B"])


def test_a_refusal_is_a_backend_error(plaidml):
    source = "function (A, I) -> (O) { O = gather(A, I); }"  # PlaidML takes int32 indices only
    with pytest.raises(TileBackendError, match=f"{ID}: PlaidML error: .*must be INT32"):
        tile.compile(source, ID)({"A": np.ones(3, np.float32), "I": np.array([0, 2])})


def test_a_program_refused_here_is_refused_with_our_error(plaidml):
    """§10.3: PlaidML aborts on a contraction with no valid tuple; the device raises the
    interpreter's located error instead, so a conformance run sees it refused alike."""
    source = "function (A) -> (O) { O[] = +(A[i + 1]), i < 1; }"
    with pytest.raises(TileIndexError, match="no index tuple of 'O' is valid") as info:
        tile.compile(source, ID)({"A": np.ones(1, np.float32)})
    assert "PlaidML abort" in str(info.value.__cause__)


def test_a_hang_is_a_backend_error():
    """No answer in time (here: a worker given no time to start) stops the worker."""
    if (why := worker.unavailable()) is not None:
        pytest.skip(why)
    dev = PlaidMLDevice(timeout=0.01)
    ins = {"A": _ints(2, 2), "B": _ints(2, 2, seed=1)}
    try:
        with pytest.raises(TileBackendError, match=f"{ID}: PlaidML hang: no result within 0.01 s"):
            dev.execute(MATMUL, ins, {})
        assert dev._worker._proc is None  # killed; the next call starts another
    finally:
        dev.close()
