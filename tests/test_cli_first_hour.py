"""The command lines and start-up as a new user meets them: honest timings (compile apart from the
first call, ``--repeat N`` for steady state), made-up inputs refused before they are made, an
``--output`` that cannot be written refused before running, ``| head`` ending quietly, help that
says its defaults, and a start that loads neither sympy nor devices nobody asked for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends import registry

REPO = Path(__file__).resolve().parents[1]
MATMUL = "function (A[M, L], B[L, N]) -> (C) {\n    C[i, j: M, N] = +(A[i, k] * B[k, j]);\n}\n"
LLVM = pytest.mark.skipif("llvm_cpu.0" not in registry.ids(), reason="llvm_cpu.0 unavailable")


def python(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


@pytest.fixture
def mm(tmp_path) -> Path:
    path = tmp_path / "mm.tile"
    path.write_text(MATMUL)
    return path


# ------------------------------------------------------------------------------ timings
@LLVM
def test_run_repeat_prints_compile_first_call_and_steady_state(mm):
    r = python("-m", "tile", "run", str(mm), "--shape", "A=64x64", "--shape", "B=64x64", "--repeat", "5")
    assert r.returncode == 0, r.stderr
    first = re.search(r"^compile: ([\d.]+) s; first call: ([\d.]+) ms \(includes one-time start-up\)$",
                      r.stdout, re.M)
    steady = re.search(r"^5 calls after the first: best ([\d.]+) ms, median ([\d.]+) ms; ([\d.]+) GFLOP/s at "
                       r"best, ([\d.]+) at the median$", r.stdout, re.M)
    assert first and steady, r.stdout
    best, median, rate = float(steady[1]), float(steady[2]), float(steady[3])
    assert best <= median
    # 2 FLOP per multiply-add (best is printed to 4 digits, the rate to 2 decimals)
    assert rate == pytest.approx(2 * 64**3 / (best * 1e-3) / 1e9, rel=0.01, abs=0.01)


@LLVM
def test_tile_debug_separates_compile_and_labels_the_first_call(mm):
    r = python("-m", "tile", "run", str(mm), "--shape", "A=32x32", "--shape", "B=32x32", "--repeat", "1",
               env={"TILE_DEBUG": "1"})
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    assert re.match(r"tile: compiled for A\[32, 32\], B\[32, 32\] on llvm_cpu\.0 in [\d.]+ s", err[0]), err[0]
    kernels = [line for line in err if line.startswith("tile: kernel ")]
    # one kernel launched (the matmul: its zero fill, built empty, is not launched), two calls
    assert len(kernels) == 2 and "matmul" in kernels[0]
    assert kernels[0].endswith("[first call]") and "first call" not in kernels[1]
    totals = [line for line in err if re.match(r"tile: 1 kernel,", line)]
    assert len(totals) == 2 and "first call" in totals[0] and "first call" not in totals[1]


def test_repeat_must_be_positive(mm):
    r = python("-m", "tile", "run", str(mm), "--repeat", "0")
    assert r.returncode == 2 and "expected a positive whole number, not '0'" in r.stderr


# ------------------------------------------------------------------ inputs and outputs
@pytest.mark.parametrize(
    "module, args, message",
    [
        ("tile", ["--shape", "A=100000x100000", "--shape", "B=100000x4"],
         "input 'A' (float32[100000, 100000]) would need 40000000000 bytes (37.3 GiB), over the limit of"),
        ("tile", ["--shape", "A=2000x2000", "--shape", "B=2000x4", "--max-buffer-bytes", "1M"],
         "would need 16000000 bytes, over the limit of 1048576 bytes for one buffer (--max-buffer-bytes)"),
        ("tile", ["--shape", "A=1000x1000", "--shape", "B=1000x4", "--max-total-bytes", "2M"],
         "the made-up inputs would need 4016000 bytes together, over the limit of 2097152 bytes "
         "(--max-total-bytes); the largest is 'A'"),
        ("ref_interp", ["--shape", "A=99999999999x99999999999", "--shape", "B=99999999999x4"],
         "would have 9999999999800000000001 elements, more than the interpreter's index-space limit"),
        ("ref_interp", ["--shape", "A=3000000000x1", "--shape", "B=1x4"],
         "input 'A' (float32[3000000000, 1]) would have 3000000000 elements"),
    ],
)
def test_made_up_inputs_too_large_are_refused_before_any_is_made(mm, module, args, message):
    r = python("-m", module, "run", str(mm), *args)
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"{mm}:1:11: ") and lines[2] == "              ^~~~~~~"  # at A[M, L]
    assert lines[-1].startswith("hint: ")


def test_made_up_inputs_keep_their_values_and_take_their_own_dtype():
    """Drawn a slice at a time into the input's dtype, the values are those of one draw."""
    import numpy as np

    from tile.dtypes import DType
    from tile.inputs import _CHUNK, random_array

    for dtype in (DType.FLOAT32, DType.INT8, DType.UINT16, DType.BOOL, DType.FLOAT16):
        shape = (3, _CHUNK // 3 + 5)  # more than one slice
        got = random_array(shape, dtype, np.random.default_rng(7))
        lo, hi = (0, 2) if dtype is DType.BOOL else (0, 7) if dtype is DType.UINT16 else (-3, 4)
        want = np.random.default_rng(7).integers(lo, hi, shape).astype(dtype.numpy)
        assert got.dtype == dtype.numpy
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("module", ["tile", "ref_interp"])
def test_output_to_a_missing_folder_is_refused_before_running(mm, module):
    r = python("-m", module, "run", str(mm), "--shape", "A=2x3", "--shape", "B=3x4",
               "--output", "/nonexistent/dir/o.npz")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "input error: cannot write '/nonexistent/dir/o.npz'" in r.stderr
    assert "C:" not in r.stdout  # nothing ran


# --------------------------------------------------------------------------------- pipes
@pytest.mark.parametrize(
    "args",
    [
        ["-m", "tile", "emit", "{mm}", "--stage", "stripe", "--shape", "A=4x4", "--shape", "B=4x4"],
        ["-m", "tile", "grad", "{mm}", "--emit"],
        ["-m", "tile", "check", "{mm}"],
        ["-m", "ref_interp", "run", "{mm}", "--shape", "A=4x4", "--shape", "B=4x4"],
    ],
)
def test_a_closed_pipe_ends_quietly(mm, args):
    """Our reader is gone before we write (``| head`` that has read enough): no traceback."""
    cmd = [sys.executable, *(a.format(mm=mm) for a in args)]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141, err  # as a tool stopped by SIGPIPE
    assert err == ""


# ---------------------------------------------------------------------------------- help
def test_help_says_the_defaults():
    emit = python("-m", "tile", "emit", "--help").stdout
    assert "default llvm_cpu.0: the llvm_cpu config" in " ".join(emit.split())
    for module, command in (("tile", "grad"), ("ref_interp", "run")):
        text = " ".join(python("-m", module, command, "--help").stdout.split())
        assert "native: compute in the declared dtypes (default)" in text, module
    run = " ".join(python("-m", "tile", "run", "--help").stdout.split())
    assert "--repeat N after the first call, time N more calls" in run


# ------------------------------------------------------------------------------ start-up
def test_import_tile_and_help_load_no_sympy_and_no_backend():
    code = "import sys, tile; print(sorted(m for m in sys.modules if m.startswith(('sympy', 'backends'))))"
    assert python("-c", code).stdout.strip() == "[]"
    r = python("-X", "importtime", "-m", "tile", "--help")
    assert r.returncode == 0
    loaded = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "tile.cli" in loaded and not any(m.startswith(("sympy", "backends")) for m in loaded)


@LLVM
def test_compile_loads_only_the_device_asked_for():
    code = ("import sys, tile; tile.compile('function (A[N]) -> (O) { O = A; }', 'llvm_cpu.0'); "
            "print(sorted(m for m in sys.modules if m.startswith(('backends.opencl', 'backends.plaidml', "
            "'backends.llvm.'))))")
    loaded = python("-c", code).stdout.strip()
    assert "backends.opencl" not in loaded and "backends.plaidml" not in loaded
    assert "backends.llvm.device" in loaded


def test_registry_loads_the_entry_point_whose_name_begins_the_id(monkeypatch):
    from importlib import metadata

    loaded = []
    devices: dict = {}
    points = [metadata.EntryPoint(n, f"plugin_{n}:devices", "tile.devices") for n in ("aaa", "bbb", "ccc")]

    def load(ep) -> None:
        loaded.append(ep.name)
        devices[f"{ep.name}.0"] = f"device of {ep.name}"

    monkeypatch.setattr(registry, "entry_points", lambda: points)
    monkeypatch.setattr(registry, "_load", load)
    monkeypatch.setattr(registry, "_devices", devices)
    monkeypatch.setattr(registry, "_all_loaded", False)  # this registry has loaded nothing yet
    assert registry.get("bbb.0") == "device of bbb" and loaded == ["bbb"]
    with pytest.raises(registry.TileDeviceError):
        registry.get("zzz.0")  # no entry point begins it: all are loaded, then it is an error
    assert sorted(set(loaded)) == ["aaa", "bbb", "ccc"]
