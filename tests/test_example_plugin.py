"""The worked plugin example, ``examples/tile_c_backend``, installed and validated as a user would.

The example is copied to a temporary folder and installed from there with ``pip install --no-deps
--target`` (the project's environment and checkout are left alone); every check then runs in a
subprocess with that folder on ``PYTHONPATH``, so Tile finds ``c_cpu.0`` through its
``tile.devices`` entry point and nothing else: ``python -m tile devices`` lists it, programs and
every builtin give the interpreter's answers on integer-valued inputs (exactly, but for the C
library's transcendental functions), an unsupported construct is refused at build time, and the
conformance suite passes on it with examples actually run. Skipped, with the reason, where there
is no C compiler.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tile_c_backend"
FAMILIES = {"contractions", "elementwise", "mixed", "gradients", "defracted", "flat", "optimized", "sized"}


def _compiler() -> str | None:
    words = shlex.split(os.environ.get("CC", "")) or ["cc"]
    return shutil.which(words[0])


pytestmark = pytest.mark.skipif(
    _compiler() is None, reason="no C compiler (cc, or $CC) on the PATH: c_cpu.0 cannot build kernels"
)


def _pip_install(source: Path, target: Path) -> subprocess.CompletedProcess:
    """``pip install`` the example into ``target``: first offline, with the environment's own
    setuptools; where that cannot build a wheel (setuptools before 70.1 without the ``wheel``
    package has no ``bdist_wheel``), in pip's isolated build environment, from the indexes pip is
    configured with."""
    base = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target", str(target)]
    done = subprocess.run([*base, "--no-build-isolation", str(source)], capture_output=True, text=True)
    if done.returncode != 0 and "bdist_wheel" in done.stdout + done.stderr:
        done = subprocess.run([*base, str(source)], capture_output=True, text=True)
    return done


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that has the example installed (and a private kernel cache)."""
    tmp = tmp_path_factory.mktemp("c_backend")
    source = tmp / "src"
    skip = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*")
    shutil.copytree(EXAMPLE, source, ignore=skip)
    site = tmp / "site"
    done = _pip_install(source, site)
    output = done.stdout + done.stderr
    if done.returncode != 0 and re.search(r"No matching distribution found for (setuptools|wheel)", output):
        pytest.skip(f"pip cannot get setuptools/wheel to build the example here: {output.strip()[-300:]}")
    assert done.returncode == 0, f"pip install of the example failed:\n{output}"
    assert (site / "tile_c_backend" / "runtime.h").is_file(), "the package data was not installed"
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    out["TILE_CACHE_DIR"] = str(tmp / "cache")
    out.pop("TILE_DEBUG", None)
    return out


def _run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _script(env: dict[str, str], code: str) -> str:
    done = _run(env, "-c", textwrap.dedent(code))
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_devices_lists_c_cpu(env):
    done = _run(env, "-m", "tile", "devices")
    assert done.returncode == 0, done.stderr
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("c_cpu.0 ")), None)
    assert line is not None, f"c_cpu.0 is not listed:\n{done.stdout}"
    assert "unavailable" not in line and "fp64: yes" in line, line


PROGRAMS = """
import numpy as np, tile, ref_interp
from backends import registry
from tile_c_backend import CDevice

import os, pathlib
dev = registry.get("c_cpu.0")
assert isinstance(dev, CDevice) and pathlib.Path(dev.optimizer).is_file(), dev.optimizer  # its own config
rng = np.random.default_rng(5)
def ints(shape, dtype, lo=-4, hi=4):
    return rng.integers(lo, hi + 1, shape).astype(dtype)
CASES = {
    "matmul": ("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
               {"A": ints((5, 7), np.float32), "B": ints((7, 3), np.float32)}),
    "int8 matmul": ("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
                    {"A": ints((4, 6), np.int8, -100, 100), "B": ints((6, 2), np.int8, -100, 100)}),
    "strided pool, padding, default": (
        "function (I[N], D) -> (P, Q) { P[i: (N + 1) / 2] = >(I[2*i + j - 1]), j < 3;"
        " Q[i: N + 2] = <(I[i - 1]), i < N default D; }",
        {"I": ints((9,), np.float64), "D": ints((11,), np.int32)}),
    "elementwise": ("function (X[N, M], Y[M]) -> (O, R) { O = (X / Y) * 3 + mod(X, Y) - (X >> 1);"
                    " R = as_uint(X < Y ? X : -Y, 8); }",
                    {"X": ints((3, 4), np.int32, -50, 50), "Y": np.array([3, -2, 0, 7], np.int32)}),
    "structural": ("function (D[R, C], I[K]) -> (G, S, T) { G = gather(D, I); S = scatter(D, index(D, 0), D);"
                   " T = reshape(D, C, R); }",
                   {"D": ints((4, 3), np.float16), "I": np.array([3, -1, 9, 0, 2], np.int64)}),
}
for name, (src, inputs) in CASES.items():
    want = ref_interp.run(src, inputs)
    got = tile.compile(src, "c_cpu.0")(inputs)
    for out, w in want.items():
        g = got[out]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, out, g.dtype, w.dtype, g.shape, w.shape)
        assert np.array_equal(g, w), (name, out, g, w)
    print("ok", name)
cache = pathlib.Path(os.environ["TILE_CACHE_DIR"]) / "c_cpu"
before = sorted(cache.glob("*.so"))
assert len(before) >= len(CASES), before  # each program's library, cached by its source's hash
got = tile.compile("function (A) -> (O) { O = A * 7 - 1; }", "c_cpu.0", {"cache": False})(A=np.int16([3]))
assert got["O"].tolist() == [20] and sorted(cache.glob("*.so")) == before  # built, kept nowhere
print("ok cache")
"""


def test_programs_equal_the_interpreter(env):
    out = _script(env, PROGRAMS)
    assert out.split().count("ok") == 6, out


BUILTINS = """
import numpy as np, tile, ref_interp
from tests.builtin_cases import ELEMENTWISE, RNG, STRUCTURAL, check_structural, combos, float16_case, program
from tests.builtin_cases import structural_inputs

LIBM = {"exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh"}
LIBM |= {"atanh", "sigmoid", "pow", "builtin_binary_crossentropy"}  # the C library's, within a few ulps
cases = [(n, *program(n, combos(n)), n in LIBM) for n in ELEMENTWISE if n != "as_bfloat"]  # no bfloat16
cases += [(n, src, structural_inputs(n, spec, RNG), False) for n, src, spec in STRUCTURAL]
cases.append(("float16 conversions", *float16_case(), False))
bad = []
for name, src, ins, ulps in cases:
    want = ref_interp.run(src, ins)
    got = tile.compile(src, "c_cpu.0")(ins)
    for k, w in want.items():
        g = got[k]
        if g.dtype != w.dtype or g.shape != w.shape:
            bad.append(f"{name} {k}: {g.dtype}{g.shape}, want {w.dtype}{w.shape}")
            continue
        same = (g == w) | ((g != g) & (w != w)) if w.dtype.kind == "f" else g == w
        if ulps:
            with np.errstate(invalid="ignore"):
                same |= np.abs(g.astype(np.float64) - w) <= 4 * np.spacing(np.abs(w)).astype(np.float64)
        if not same.all():
            at = tuple(np.argwhere(~same)[0])
            bad.append(f"{name} {k}{list(at)}: {g[at]!r}, want {w[at]!r}")
    if name in {n for n, _, _ in STRUCTURAL}:
        check_structural(name, ins, got)
print(len(cases), "programs")
assert not bad, "\\n".join(bad)
"""


def test_every_builtin_equals_the_interpreter(env):
    """The builtin programs of the LLVM and OpenCL builtin tests: each builtin on every dtype
    combination, with each type's extremes, inf, nan and halves mixed in."""
    out = _script(env, BUILTINS)
    assert int(out.split()[0]) > 60, out


UNSUPPORTED = """
from backends import registry
from backends.hal import KernelInfo
from stripe.ir import Block, RefDir, Refinement, Special, TensorShape
from tile.dtypes import DType
from tile.errors import TileError

out = Refinement(RefDir.OUT, "O", (), TensorShape.dense(DType.FLOAT32, ()), agg_op="assign")
block = Block("k0_O", refs=(out,), stmts=(Special("fft", (), ("O",)),), tags=frozenset({"kernel"}))
try:
    registry.get("c_cpu.0").compiler.build([KernelInfo("k0_O", block, ("O",), (DType.FLOAT32,))], {})
except TileError as e:
    print(type(e).__name__, "|", e.message)
"""


def test_an_unsupported_construct_is_refused_when_building(env):
    out = _script(env, UNSUPPORTED)
    assert out.startswith("UnsupportedConstruct | ") and "the special 'fft'" in out and "k0_O" in out, out


def test_conformance_passes_on_c_cpu(env, tmp_path):
    done = _run(
        env,
        *("-m", "pytest", "conformance/test_conformance.py", "-p", "no:cacheprovider", "-q"),
        *("--target", "c_cpu.0", "--conformance-examples=3", f"--conformance-failures={tmp_path}"),
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # the summary table: one row per family and target; every family ran examples on c_cpu.0
    lines = output.splitlines()
    header = next((ln.split() for ln in lines if ln.split()[:2] == ["family", "target"]), None)
    assert header is not None, output[-3000:]
    ran = {}
    for ln in lines:
        cells = ln.split()
        if len(cells) == len(header) and cells[1] == "c_cpu.0":
            row = dict(zip(header, cells))
            ran[row["family"]] = (int(row["examples"]), int(row["failed"]))
    assert FAMILIES <= set(ran), f"families missing from the summary: {FAMILIES - set(ran)}\n{output[-3000:]}"
    assert all(n > 0 and failed == 0 for n, failed in ran.values()), ran
