"""Compiled targets refuse, before allocating anything, buffers their device cannot hold
(docs/semantics.md §8.4): each buffer and all of them together are checked against the device's
memory (``Device.memory_bytes``) and the ``max_buffer_bytes`` / ``max_total_bytes`` settings."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import registry
from backends.hal import MemoryLimit
from tile.errors import TileResourceError, TileRuntimeError

REPO = Path(__file__).resolve().parents[1]
DEVICES = list(registry.devices()) or ["<none>"]
pytestmark = pytest.mark.usefixtures("private_cache")
SUM = "function (A[N, M]) -> (O) { O[i, j: 16, 16] = +(A[i, j]); }"  # O: float32 16x16 = 1024 bytes


@pytest.fixture(params=DEVICES)
def device_id(request, monkeypatch):
    if request.param == "<none>":
        pytest.skip(f"no compiled device: {registry.unavailable()}")
    allocated: list[int] = []
    ex = registry.get(request.param).executor
    real = ex.allocate
    monkeypatch.setattr(ex, "allocate", lambda size: allocated.append(size) or real(size))
    request.node.allocated = allocated
    return request.param


def a(n=4, m=4):
    return np.arange(n * m, dtype=np.float32).reshape(n, m)


def test_the_device_reports_its_memory(device_id):
    mem = registry.get(device_id).memory_bytes()
    assert isinstance(mem, MemoryLimit) and mem.what
    assert mem.total is not None and mem.total > 0
    if mem.per_buffer is not None:
        assert 0 < mem.per_buffer <= mem.total


def test_a_buffer_over_max_buffer_bytes_is_refused_before_allocating(device_id, request):
    f = tile.compile(SUM, device_id, {"max_buffer_bytes": 1023})
    with pytest.raises(TileResourceError) as e:
        f(A=a())
    err = e.value
    assert isinstance(err, TileRuntimeError)
    assert "tensor 'O' (float32[16, 16]) needs 1024 bytes" in err.message
    assert "over the limit of 1023 bytes for one buffer (the max_buffer_bytes setting)" in err.message
    assert err.span is not None and "O[i, j: 16, 16]" in str(err) and "^" in str(err)
    assert err.hint and "max_buffer_bytes" in err.hint
    assert request.node.allocated == []


def test_a_buffer_at_the_limit_runs(device_id, request):
    x = a()
    got = tile.compile(SUM, device_id, {"max_buffer_bytes": 1024})(A=x)["O"]
    want = np.zeros((16, 16), np.float32)
    want[:4, :4] = x
    np.testing.assert_array_equal(got, want)
    assert request.node.allocated


def test_buffers_over_max_total_bytes_together_are_refused(device_id, request):
    src = "function (A[N], B[N]) -> (O) { O = A + B; }"  # three float32 buffers of 400 bytes
    x = np.ones(100, np.float32)
    with pytest.raises(TileResourceError) as e:
        tile.compile(src, device_id, {"max_total_bytes": 1199})(A=x, B=x)
    msg = e.value.message
    assert (
        "buffers need 1200 bytes together, over the limit of 1199 bytes (the max_total_bytes setting)" in msg
    )
    assert "float32[100], 400 bytes" in msg
    assert request.node.allocated == []
    got = tile.compile(src, device_id, {"max_total_bytes": 1200})(A=x, B=x)["O"]
    np.testing.assert_array_equal(got, x + x)


def test_the_device_limits_apply_without_settings(device_id, monkeypatch, request):
    dev = registry.get(device_id)
    monkeypatch.setattr(dev, "memory_bytes", lambda: MemoryLimit(4000, 1000, "a small test device"))
    with pytest.raises(
        TileResourceError, match=r"1024 bytes, over the limit of 1000 bytes for one buffer \(a small"
    ):
        tile.compile(SUM, device_id)(A=a())
    with pytest.raises(TileResourceError, match=r"for one buffer \(a small test device\)"):
        tile.compile(SUM, device_id)(A=a())
    monkeypatch.setattr(dev, "memory_bytes", lambda: MemoryLimit(1087, None, "a small test device"))
    with pytest.raises(TileResourceError, match=r"1088 bytes together, over the limit of 1087 bytes"):
        tile.compile(SUM, device_id)(A=a())  # O alone fits, with A (64 bytes) it does not
    monkeypatch.setattr(dev, "memory_bytes", lambda: MemoryLimit(1 << 20, 1 << 20, "a small test device"))
    with pytest.raises(TileResourceError, match="the max_buffer_bytes setting"):
        tile.compile(SUM, device_id, {"max_buffer_bytes": 100})(A=a())  # a setting only lowers it
    assert request.node.allocated == []


def _cli_run(src: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    prog = tmp_path / "big.tile"
    prog.write_text(src)
    env = {**os.environ, "TILE_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "tile", "run", str(prog), "--target", "llvm_cpu.0", "--shape", "A=2x2"]
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return r, time.perf_counter() - start


def _llvm_available_bytes() -> int:
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"llvm_cpu.0 unavailable: {registry.unavailable()}")
    mem = registry.get("llvm_cpu.0").memory_bytes()
    if mem.total is None:
        pytest.skip("this host does not report its available memory")
    return mem.total


def test_the_issue_program_exits_1_with_the_message(tmp_path):
    """The issue's 37.3 GiB output, where the host has less than that available."""
    if _llvm_available_bytes() >= 40_000_000_000:
        pytest.skip("this host has 40 GB available: the issue's program fits (the next test does not)")
    r, secs = _cli_run("function (A[N, M]) -> (O) { O[i, j: 100000, 100000] = +(A[i, j]); }", tmp_path)
    assert r.returncode == 1, r.stderr
    assert "tensor 'O' (float32[100000, 100000]) needs 40000000000 bytes (37.3 GiB)" in r.stderr
    assert "the host's available memory" in r.stderr or "memory limit" in r.stderr
    assert "MemoryError" not in r.stderr and "Traceback" not in r.stderr
    assert secs < 60


def test_an_output_larger_than_any_host_exits_1_with_the_message(tmp_path):
    _llvm_available_bytes()
    r, secs = _cli_run("function (A[N, M]) -> (O) { O[i, j: 10000000, 10000000] = +(A[i, j]); }", tmp_path)
    assert r.returncode == 1, r.stderr
    assert "tensor 'O' (float32[10000000, 10000000]) needs 400000000000000 bytes" in r.stderr
    assert "hint:" in r.stderr and "Traceback" not in r.stderr
    assert secs < 60


def _cli(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    prog = tmp_path / "sum.tile"
    prog.write_text(SUM)
    env = {**os.environ, "TILE_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "tile", "run", str(prog), "--target", "llvm_cpu.0", "--shape", "A=4x4"]
    cmd += flags
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_the_cli_limit_flags_lower_the_limits(tmp_path):
    """``python -m tile run --max-buffer-bytes / --max-total-bytes``: the settings, from the shell."""
    _llvm_available_bytes()
    r = _cli(tmp_path, "--max-buffer-bytes", "1023")
    assert r.returncode == 1, r.stderr
    want = "needs 1024 bytes, over the limit of 1023 bytes for one buffer (the max_buffer_bytes setting)"
    assert want in r.stderr
    assert "sum.tile:1:29" in r.stderr and "Traceback" not in r.stderr
    r = _cli(tmp_path, "--max-total-bytes", "1K")  # O (1024 bytes) and A (64) need 1088
    assert r.returncode == 1, r.stderr
    assert "need 1088 bytes together, over the limit of 1024 bytes (the max_total_bytes setting)" in r.stderr
    r = _cli(tmp_path, "--max-buffer-bytes", "1024", "--max-total-bytes", "1088")
    assert r.returncode == 0, r.stderr
    assert "O: float32[16, 16]" in r.stdout


@pytest.mark.parametrize("value", ["0", "-5", "1x", "K", "1.5G"])
def test_the_cli_limit_flags_refuse_what_is_not_a_byte_count(tmp_path, value):
    r = _cli(tmp_path, "--max-total-bytes", value)
    assert r.returncode == 2 and "expected a positive byte count" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
