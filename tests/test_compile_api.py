"""tile.compile and the device command lines: every earlier test program on every device."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry

DEVICES = list(registry.devices())
REPO = Path(__file__).resolve().parents[1]

# The tutorial's programs and the autodiff seed's, with small integer-valued inputs.
PROGRAMS = {
    "sum_axis": ("function (I[M, N]) -> (O) { O[n: N] = +(I[m, n]); }", {"I": (3, 4)}),
    "matmul": (
        "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
        {"A": (3, 5), "B": (5, 2)},
    ),
    "max_axis": ("function (I[M, N]) -> (O) { O[n: N] = >(I[m, n]); }", {"I": (3, 4)}),
    "global_min": (
        "function (I) -> (O) { Neg = -I; O_Neg[] = >(Neg[i, j, k]); O = -O_Neg; }",
        {"I": (2, 3, 2)},
    ),
    "mean": ("function (I[X, Y]) -> (O) { Sum[] = +(I[x, y]); O = Sum / (X * Y); }", {"I": (2, 3)}),
    "maxpool": ("function (I[N]) -> (O) { O[i: (N + 1) / 2] = >(I[2 * i + j]), j < 2; }", {"I": (7,)}),
    "skipping": ("function (I[N, M]) -> (O) { O[2 * i: N] = +(I[2 * i, j]); }", {"I": (5, 3)}),
    "cumsum": ("function (I[N]) -> (O) { O[i: N] = +(I[k]), i - k < N; }", {"I": (6,)}),
    "conv1d": (
        "function (I[N, L, CI], K[LK, CI, CO]) -> (O) { O[n, x, co: N, L - LK + 1, CO] = "
        "+(I[n, x + k, ci] * K[k, ci, co]); }",
        {"I": (2, 7, 3), "K": (3, 3, 2)},
    ),
    "dilated_conv2d": (
        "function (I[N, Lx, Ly, CI], K[LKx, LKy, CI, CO]) -> (O) { O[n, x, y, co: N, "
        "Lx - 2 * (LKx - 1), Ly - 3 * (LKy - 1), CO] = +(I[n, x + 2 * kx, y + 3 * ky, ci] * "
        "K[kx, ky, ci, co]); }",
        {"I": (1, 7, 8, 2), "K": (2, 2, 2, 3)},
    ),
    "seed_conv": (
        "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) { O[n, y, x, co: N, H/3, W/3, CO] = "
        "+(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }",
        {"I": (1, 9, 9, 2), "K": (2, 2, 2, 3)},
    ),
    "seed_grad": (
        "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) { DI[n, 3*y + 2*j, 3*x + 2*i, ci: "
        "N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]); }",
        {"DO": (2, 3, 3, 7), "K": (2, 2, 5, 7)},
    ),
}


def _inputs(shapes: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.integers(-3, 4, s).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("device", DEVICES or ["<none>"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_earlier_programs_on_every_device(device, name):
    if device == "<none>":
        pytest.skip(f"no compiled device: {registry.unavailable()}")
    src, shapes = PROGRAMS[name]
    ins = _inputs(shapes)
    got = tile.compile(src, device)(ins)
    want = ref_interp.run(src, ins)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        assert got[k].dtype == want[k].dtype


def test_interp_target_is_the_interpreter():
    src, shapes = PROGRAMS["matmul"]
    ins = _inputs(shapes)
    f = tile.compile(src, "interp")
    np.testing.assert_array_equal(f(ins)["C"], ins["A"] @ ins["B"])
    np.testing.assert_array_equal(f(A=ins["A"], B=ins["B"])["C"], ins["A"] @ ins["B"])


def test_unknown_device_lists_the_available_ones():
    with pytest.raises(tile.TileDeviceError) as e:
        tile.compile("function (A) -> (B) { B = A; }", "no_such.0")
    assert "interp" in str(e.value) and "no device 'no_such.0'" in str(e.value)
    assert "hint: pick an id from `python -m tile devices`" in str(e.value)


@pytest.mark.skipif("llvm_cpu.0" not in DEVICES, reason=f"llvm_cpu.0 unavailable: {registry.unavailable()}")
def test_compiled_once_per_input_signature():
    f = tile.compile(PROGRAMS["sum_axis"][0], "llvm_cpu.0")
    for shape in [(3, 4), (3, 4), (2, 5)]:
        x = _inputs({"I": shape})["I"]
        np.testing.assert_array_equal(f(I=x)["O"], x.sum(axis=0))
    assert len(f._compiled) == 2  # (3, 4) twice reuses the first build


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tile", *args], capture_output=True, text=True, cwd=REPO, env=env
    )


def test_devices_command_lists_interp_and_devices():
    r = _cli("devices")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("interp")
    for d in DEVICES:
        assert d in r.stdout


def test_devices_require_fails_only_for_a_missing_kind():
    assert _cli("devices", "--require", "interp").returncode == 0
    r = _cli("devices", "--require", "interp", "--require", "no_such_kind")
    assert r.returncode == 1
    assert "no available device whose id starts with 'no_such_kind'" in r.stderr


@pytest.mark.skipif("llvm_cpu.0" not in DEVICES, reason=f"llvm_cpu.0 unavailable: {registry.unavailable()}")
def test_run_command_writes_the_outputs_and_uses_the_cache_dir(tmp_path):
    import os

    prog = tmp_path / "mm.tile"
    prog.write_text(PROGRAMS["matmul"][0])
    ins = _inputs(PROGRAMS["matmul"][1])
    np.savez(tmp_path / "in.npz", **ins)
    env = {**os.environ, "TILE_CACHE_DIR": str(tmp_path / "cache")}
    run = ["run", str(prog), "--target", "llvm_cpu.0", "--inputs", str(tmp_path / "in.npz")]
    r = _cli(*run, "--output", str(tmp_path / "out.npz"), env=env)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["C"], ins["A"] @ ins["B"])
    assert any((tmp_path / "cache").rglob("*")), "the kernel cache was not written under TILE_CACHE_DIR"
    r = _cli(*run, "--no-cache", env=env)
    assert r.returncode == 0, r.stderr
    bad = _cli("run", str(prog), "--target", "nope.0", "--inputs", str(tmp_path / "in.npz"))
    assert bad.returncode == 2 and "available" in bad.stderr


def test_emit_stripe_prints_the_program(tmp_path):
    prog = tmp_path / "mm.tile"
    prog.write_text(PROGRAMS["matmul"][0])
    r = _cli("emit", str(prog), "--stage", "stripe", "--shape", "A=2x3", "--shape", "B=3x4")
    assert r.returncode == 0, r.stderr
    assert "#program" in r.stdout and "#main" in r.stdout and "#contraction" in r.stdout


# ------------------------------------------------------------- what the interpreter refuses
DOUBLE_WRITE = "function (A[N]) -> (O) { O[i: 2] = =(A[i + j]), j < 2; }"


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_programs_refuse_a_double_assignment_like_the_interpreter(device):
    a = np.arange(4, dtype=np.float32)
    with pytest.raises(tile.TileError) as want:
        ref_interp.run(DOUBLE_WRITE, {"A": a})
    with pytest.raises(type(want.value)) as got:
        tile.compile(DOUBLE_WRITE, device)(A=a)
    assert got.value.message == want.value.message == (
        "`=` writes O[0] more than once: from (i=0, j=0) and (i=0, j=1)"
    )
    assert str(got.value) == str(want.value)  # the same location and caret


def _bound(src: str, **shapes):
    from tile.typed import TensorType

    prog = tile.parse(src)
    return tile.bind(prog, {k: TensorType(tile.dtypes.DType.FLOAT32, s) for k, s in shapes.items()})


def test_single_writer_check_needs_no_enumeration_when_each_element_has_one_tuple(monkeypatch):
    from tile import tuples

    def enumerate_nothing(*args, **kwargs):
        raise AssertionError("enumerated")

    monkeypatch.setattr(tuples, "blocks", enumerate_nothing)
    # a transpose of a large tensor and a strided copy: after reduce nothing is summed over
    transpose = "function (A[N, M]) -> (O) { O[j, i: M, N] = =(A[i, j]); }"
    tuples.check_assignments(_bound(transpose, A=(5000, 4000)))
    tuples.check_assignments(_bound("function (A[N]) -> (O) { O[2*i: 10] = =(A[i]); }", A=(5,)))
    with pytest.raises(AssertionError, match="enumerated"):  # a summed index: it must look
        tuples.check_assignments(_bound(DOUBLE_WRITE, A=(4,)))


def test_single_writer_check_passes_a_summed_index_with_one_valid_value():
    from tile import tuples

    # j is summed over, but the constraint 0 <= j - i < 1 leaves one j per i: written once each
    ok = _bound("function (A[N]) -> (O) { O[i: 2] = =(A[i + j]), j - i < 1; }", A=(4,))
    tuples.check_assignments(ok)
    np.testing.assert_array_equal(ref_interp.run(ok.program, {"A": np.arange(4.0)})["O"], [0.0, 2.0])
    # past its enumeration budget the check gives up rather than refuse a valid program
    tuples.check_assignments(_bound(DOUBLE_WRITE, A=(4,)), max_points=1)
