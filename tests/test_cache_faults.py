"""The kernel disk cache under faults, on every compiled device: concurrent builders, corrupted
entries, an unusable cache directory, and a key that changes with everything that decides a kernel.

Every build goes to a private ``TILE_CACHE_DIR`` under ``tmp_path``; results are compared exactly
with numpy on integer-valued inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import diskcache, registry
from backends.driver import compile_bound
from tile.bind import bind
from tile.inputs import input_types

REPO = Path(__file__).resolve().parents[1]
DEVICES = list(registry.devices()) or ["<none>"]
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"
SCALE = "function (A[N]) -> (O) { O = A * 3 + 1; }"
RNG = np.random.default_rng(11)


def ints(shape, dtype=np.float32):
    return RNG.integers(-3, 4, shape).astype(dtype)


@pytest.fixture(params=DEVICES)
def device_id(request, tmp_path, monkeypatch):
    if request.param == "<none>":
        pytest.skip(f"no compiled device: {registry.unavailable()}")
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(diskcache, "_warned", set())  # every test sees its own first warning
    return request.param


def build(src: str, ins: dict, device_id: str, settings: dict | None = None):
    """Compile and run once (the OpenCL build synchronously); the program and its outputs."""
    p = tile.parse(src)
    cp = compile_bound(
        bind(p, input_types(p, ins)), registry.get(device_id), {"async": False, **(settings or {})}
    )
    return cp, cp(ins)


def entries(directory: Path) -> list[Path]:
    return (
        sorted(p for p in directory.iterdir() if p.suffix in (".o", ".clbin")) if directory.exists() else []
    )


# ------------------------------------------------------------------------- concurrent builders
WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import numpy as np
    import tile
    go, device, n, ready = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"
    rng = np.random.default_rng(0)
    a, b = rng.integers(-3, 4, (n, 7)).astype(np.float32), rng.integers(-3, 4, (7, 5)).astype(np.float32)
    f = tile.compile(src, device, {"async": False})
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    ok = bool((f(A=a, B=b)["C"] == a @ b).all())
    lib = next(iter(f._compiled.values())).library
    print(json.dumps({"ok": ok, "cache": lib.extra["cache"], "key": lib.extra["cache_key"]}))
    """
)


def test_two_processes_build_the_same_new_program_at_once(device_id, tmp_path):
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    env = {**os.environ, "TILE_CACHE_DIR": str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(go), device_id, "13", str(tmp_path / f"ready{k}")],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{k}").exists() for k in range(2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both have imported and parsed: release them together
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        assert "CacheWarning" not in err, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results), results
    assert results[0]["key"] == results[1]["key"]
    assert {r["cache"] for r in results} <= {"miss", "hit"}
    (entry,) = entries(cache)
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")], "a temporary file was left"
    assert diskcache.read_entry(entry, results[0]["key"]) is not None, "the entry is not valid"
    a, b = ints((13, 7)), ints((7, 5))
    cp, out = build(MATMUL, {"A": a, "B": b}, device_id)
    assert cp.library.extra["cache"] == "hit" and cp.library.extra["cache_key"] == results[0]["key"]
    np.testing.assert_array_equal(out["C"], a @ b)


# ------------------------------------------------------------------------- corrupted entries
def test_every_truncation_and_bit_flip_of_an_entry_is_refused():
    key = "ab" * 32
    raw = diskcache.pack(key, b"machine code \x00\x01\x02")
    assert diskcache.unpack(key, raw) == b"machine code \x00\x01\x02"
    for cut in range(len(raw)):
        assert diskcache.unpack(key, raw[:cut]) is None, cut
    for at in range(len(raw)):
        flipped = raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :]
        assert diskcache.unpack(key, flipped) is None, at
    assert diskcache.unpack("cd" * 32, raw) is None  # another key's entry under this name
    assert diskcache.unpack(key, raw + b"x") is None


CORRUPTIONS = {
    "truncated": lambda raw, other: raw[: len(raw) // 2],
    "header only": lambda raw, other: raw[: len(diskcache.MAGIC) + 104],
    "flipped byte": lambda raw, other: raw[:-9] + bytes([raw[-9] ^ 0xFF]) + raw[-8:],
    "garbage": lambda raw, other: b"\x7fELF" + bytes(range(256)) * 4,
    "empty": lambda raw, other: b"",
    "other key": lambda raw, other: other,
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupted_entry_is_rebuilt_never_loaded(device_id, tmp_path, corruption):
    a, b = ints((6, 4)), ints((4, 3))
    first, _ = build(MATMUL, {"A": a, "B": b}, device_id)
    other, _ = build(SCALE, {"A": ints(9)}, device_id)
    path = Path(first.library.extra["cache_path"])
    assert first.library.extra["cache"] == "miss" and path.exists()
    bad = CORRUPTIONS[corruption](path.read_bytes(), Path(other.library.extra["cache_path"]).read_bytes())
    path.write_bytes(bad)
    again, out = build(MATMUL, {"A": a, "B": b}, device_id)
    assert again.library.extra["cache"] == "miss", "a corrupted entry was loaded"
    np.testing.assert_array_equal(out["C"], a @ b)
    assert diskcache.read_entry(path, first.library.extra["cache_key"]) is not None, "not rewritten"
    third, out = build(MATMUL, {"A": a, "B": b}, device_id)
    assert third.library.extra["cache"] == "hit"
    np.testing.assert_array_equal(out["C"], a @ b)


# ------------------------------------------------------------------- an unusable cache directory
def _build_twice_recording(device_id):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for src, ins, want in [
            (SCALE, {"A": np.arange(5, dtype=np.float32)}, np.arange(5) * 3 + 1),
            (MATMUL, {"A": np.eye(3, dtype=np.float32), "B": np.eye(3, dtype=np.float32)}, np.eye(3)),
        ]:
            cp, out = build(src, ins, device_id)
            np.testing.assert_array_equal(out[next(iter(out))], want)
            assert cp.library.extra["cache"] == "miss"
    return [w for w in seen if issubclass(w.category, diskcache.CacheWarning)]


def test_an_uncreatable_cache_directory_runs_uncached_and_warns_once(device_id, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILE_CACHE_DIR", str(blocker / "cache"))
    warned = _build_twice_recording(device_id)
    assert len(warned) == 1, [str(w.message) for w in warned]
    message = str(warned[0].message)
    assert str(blocker / "cache") in message and "without the disk cache" in message


def _read_only_dir(tmp_path) -> Path:
    """A directory that exists but takes no new files: a mode 555 one, or for root (who ignores
    modes) ``/sys``, which containers and hosts mount read-only or refuse creating files in."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro
    try:
        fd, name = tempfile.mkstemp(dir="/sys")
    except OSError:
        return Path("/sys")
    os.close(fd)
    os.unlink(name)
    pytest.skip("running as root and /sys is writable: no read-only directory to try")


def test_a_read_only_cache_directory_runs_uncached_and_warns_once(device_id, tmp_path, monkeypatch):
    ro = _read_only_dir(tmp_path)
    monkeypatch.setenv("TILE_CACHE_DIR", str(ro))
    try:
        warned = _build_twice_recording(device_id)
    finally:
        if ro.is_relative_to(tmp_path):
            ro.chmod(0o755)
    assert len(warned) == 1 and str(ro) in str(warned[0].message), [str(w.message) for w in warned]
    assert entries(ro) == []


def test_the_command_line_says_once_that_the_cache_is_unusable(tmp_path):
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"llvm_cpu.0 unavailable: {registry.unavailable()}")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    prog = tmp_path / "two.tile"
    prog.write_text("function (A[N]) -> (O, P) { O = A + 1; P[i: N] = +(A[i] * A[j]); }")
    env = {**os.environ, "TILE_CACHE_DIR": str(blocker / "cache")}
    r = subprocess.run(
        [sys.executable, "-m", "tile", "run", str(prog), "--target", "llvm_cpu.0", "--shape", "A=4"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("CacheWarning") == 1 and r.stderr.count("cannot be written") == 1, r.stderr


# --------------------------------------------------------------------------------- the key
def _key(src, ins, device_id, settings=None):
    cp, out = build(src, ins, device_id, settings)
    return cp.library.extra["cache_key"], cp.library.extra["cache"], out


def test_the_key_follows_the_generated_code_across_shapes_and_dtypes(device_id):
    """Shapes and dtypes reach the key through the generated code: two builds share a key exactly
    when their code is the same (e.g. an elementwise LLVM kernel whose length is a run-time range),
    and a shared entry still gives each build its own correct result."""
    builds = []
    for src, ins, want in [
        (SCALE, {"A": ints(8)}, lambda i: i["A"] * 3 + 1),
        (SCALE, {"A": ints(9)}, lambda i: i["A"] * 3 + 1),
        (SCALE, {"A": np.arange(8, dtype=np.int32)}, lambda i: i["A"] * 3 + 1),
        (SCALE, {"A": np.arange(8, dtype=np.float64)}, lambda i: i["A"] * 3 + 1),
        (MATMUL, {"A": ints((4, 5)), "B": ints((5, 3))}, lambda i: i["A"] @ i["B"]),
        (MATMUL, {"A": ints((4, 6)), "B": ints((6, 3))}, lambda i: i["A"] @ i["B"]),
        (MATMUL, {"A": ints((4, 5), np.int32), "B": ints((5, 3), np.int32)}, lambda i: i["A"] @ i["B"]),
    ]:
        cp, out = build(src, ins, device_id)
        got = out[next(iter(out))]
        np.testing.assert_array_equal(got, want(ins))
        assert got.dtype == next(iter(ins.values())).dtype
        builds.append((cp.library.extra["cache_key"], cp.library.source))
    for key, source in builds:
        for key2, source2 in builds:
            assert (key == key2) == (source == source2)
    assert builds[0][0] != builds[2][0] != builds[3][0]  # int32 / float64 code differs from float32
    assert builds[4][0] != builds[5][0] != builds[6][0]  # a new reduction length or dtype: new code


SETTING = {"llvm": {"opt": 1}, "opencl": {"local_size": 32}}


def test_a_changed_setting_never_serves_an_old_kernel(device_id):
    ins = {"A": ints((5, 4)), "B": ints((4, 6))}
    base, _, _ = _key(MATMUL, ins, device_id)
    setting = SETTING["opencl" if device_id.startswith("opencl") else "llvm"]
    changed, status, out = _key(MATMUL, ins, device_id, setting)
    assert changed != base and status == "miss"
    np.testing.assert_array_equal(out["C"], ins["A"] @ ins["B"])
    for strict in (True, False):  # a setting the optimizer reads: a different key as well
        key, _, _ = _key(MATMUL, ins, device_id, {"strict": strict})
        assert key != base


def test_a_changed_config_file_never_serves_an_old_kernel(device_id, tmp_path):
    """The same config path with new content (the device's tiled pipeline instead of its default
    one): the optimizer produces different Stripe, so the generated code, and with it the key,
    differs, and the kernel is rebuilt from the new config. The path or built-in name is hashed
    with the other settings as well."""
    ins = {"A": ints((64, 48)), "B": ints((48, 40))}
    dev = registry.get(device_id)
    targets = REPO / "stripe" / "targets"
    path = tmp_path / "mine.json"
    path.write_text((targets / f"{dev.optimizer}.json").read_text())
    first, _, out = _key(MATMUL, ins, device_id, {"config": str(path)})
    assert _key(MATMUL, ins, device_id, {"config": str(path)})[1] == "hit"
    path.write_text((targets / f"{dev.tiled_optimizer}.json").read_text())
    second, status, out2 = _key(MATMUL, ins, device_id, {"config": str(path)})
    assert second != first and status == "miss"
    np.testing.assert_array_equal(out["C"], ins["A"] @ ins["B"])
    np.testing.assert_array_equal(out2["C"], ins["A"] @ ins["B"])
    named, _, _ = _key(MATMUL, ins, device_id, {"config": dev.tiled_optimizer})
    assert named not in (first, second)


def test_a_new_project_version_never_serves_an_old_kernel(device_id, monkeypatch):
    ins = {"A": ints(7)}
    base, _, _ = _key(SCALE, ins, device_id)
    assert _key(SCALE, ins, device_id)[1] == "hit"
    monkeypatch.setattr(diskcache, "VERSION", diskcache.VERSION + "+next")
    bumped, status, out = _key(SCALE, ins, device_id)
    assert bumped != base and status == "miss"
    np.testing.assert_array_equal(out["O"], ins["A"] * 3 + 1)
