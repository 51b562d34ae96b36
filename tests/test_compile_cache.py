"""The program cache (``backends.progcache``): a program built before, for the same shapes, dtypes,
settings, device and code, is restored without lowering or optimizing; anything else that decides
the build misses it; a damaged entry is rebuilt, never used. Calls are counted, not timed (the
times are bench/compile_time.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import driver, progcache

REPO = Path(__file__).resolve().parent.parent

MATMUL_ADD = """function (A[M, K], B[K, N], C[M, N]) -> (O) {
  P[i, j: M, N] = +(A[i, k] * B[k, j]);
  O = P + C;
}"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, and a count of the programs lowered."""
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    lowered = [0]
    real = driver.lower

    def counted(*a, **k):
        lowered[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(driver, "lower", counted)
    return tmp_path, lowered


def _ints(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).integers(-3, 4, shape).astype(dtype)


def _inputs(m=5, k=7, n=6, dtype=np.float32):
    return {"A": _ints((m, k), 1, dtype), "B": _ints((k, n), 2, dtype), "C": _ints((m, n), 3, dtype)}


def _first_call(src, x, settings=None, device="llvm_cpu.0"):
    """A fresh executable's compile + first call: (outputs, the compiled program), checked equal
    to the interpreter."""
    exe = tile.compile(src, device, settings)
    got = exe(x)
    want = tile.compile(src, "interp")(x)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
    return got, exe._last


def _status(cp) -> str:
    return cp.library.extra["program_cache"]


def test_a_program_built_before_is_restored_without_lowering(cache):
    _, lowered = cache
    x = _inputs()
    _, cold = _first_call(MATMUL_ADD, x)
    assert _status(cold) == "miss" and lowered[0] == 1
    _, warm = _first_call(MATMUL_ADD, x)
    assert _status(warm) == "hit" and lowered[0] == 1, "a cached program was lowered again"
    assert warm.library.extra["cache"] == "hit"  # the object code came from the object cache
    assert [i.name for i in warm.infos] == [i.name for i in cold.infos]
    assert warm.lowered is None and warm.program == cold.program


@pytest.mark.parametrize(
    "change",
    ["source", "shape", "dtype", "setting", "threads", "code"],
)
def test_whatever_decides_the_build_misses_the_cache(cache, change, monkeypatch):
    _, lowered = cache
    _first_call(MATMUL_ADD, _inputs())
    src, x, settings = MATMUL_ADD, _inputs(), None
    if change == "source":
        src = MATMUL_ADD.replace("O = P + C", "O = P - C")
    elif change == "shape":
        x = _inputs(n=9)
    elif change == "dtype":
        x = _inputs(dtype=np.float64)
    elif change == "setting":
        settings = {"opt": 2}
    elif change == "code":  # an edited checkout: another code identity
        monkeypatch.setattr(progcache, "_code_identity", "another checkout")
    if change == "threads":  # another device: the same backend with another thread count
        from backends.llvm.device import LlvmCpuDevice

        bound = driver.bind_inputs(tile.parse(src), x)
        cp = driver.compile_bound(bound, LlvmCpuDevice(threads=1), {})
        want = tile.compile(src, "interp")(x)
        np.testing.assert_array_equal(cp(x)["O"], want["O"])
    else:
        _, cp = _first_call(src, x, settings)
    assert _status(cp) == "miss" and lowered[0] == 2


def test_an_edited_config_file_misses(cache, tmp_path):
    _, lowered = cache
    from stripe.config import TARGETS

    config = tmp_path / "mine.json"
    config.write_text((TARGETS / "llvm_cpu.json").read_text())
    _, cold = _first_call(MATMUL_ADD, _inputs(), {"config": str(config)})
    _, warm = _first_call(MATMUL_ADD, _inputs(), {"config": str(config)})
    assert (_status(cold), _status(warm), lowered[0]) == ("miss", "hit", 1)
    text = json.loads(config.read_text())
    text["passes"] = text["passes"][:1]  # fewer passes: another program
    config.write_text(json.dumps(text))
    _, edited = _first_call(MATMUL_ADD, _inputs(), {"config": str(config)})
    assert _status(edited) == "miss" and lowered[0] == 2


def test_a_size_input_value_is_part_of_the_key(cache):
    _, lowered = cache
    src = "function (A[N], K) -> (O) { O[i: K] = +(A[i]); }"
    a = np.arange(8, dtype=np.float32)
    outs = []
    for k in (3, 3, 5):
        got, cp = _first_call(src, {"A": a, "K": np.int32(k)})
        outs.append((_status(cp), got["O"].shape))
    assert outs == [("miss", (3,)), ("hit", (3,)), ("miss", (5,))] and lowered[0] == 2


def test_no_cache_setting_bypasses_it(cache):
    tmp, lowered = cache
    _, cp = _first_call(MATMUL_ADD, _inputs(), {"cache": False})
    _, again = _first_call(MATMUL_ADD, _inputs(), {"cache": False})
    assert _status(cp) == _status(again) == "off" and lowered[0] == 2
    assert not list(tmp.glob("*.prog"))


def test_watching_the_passes_bypasses_it(cache, monkeypatch, capfd):
    """``TILE_DEBUG=2`` prints each pass (the README's command): a cached program must still show
    them, so the cache is neither read nor written while it is set."""
    _, lowered = cache
    _first_call(MATMUL_ADD, _inputs())  # now cached
    monkeypatch.setenv("TILE_DEBUG", "2")
    capfd.readouterr()
    _, cp = _first_call(MATMUL_ADD, _inputs())
    assert _status(cp) == "off" and lowered[0] == 2
    assert "=== " in capfd.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "flipped", "not a pickle", "emptied"])
def test_a_damaged_program_entry_is_rebuilt(cache, damage):
    tmp, lowered = cache
    x = _inputs()
    _first_call(MATMUL_ADD, x)
    (entry,) = tmp.glob("*.prog")
    raw = entry.read_bytes()
    if damage == "truncated":
        entry.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        entry.write_bytes(raw[:-20] + bytes([raw[-20] ^ 0x55]) + raw[-19:])
    elif damage == "not a pickle":  # a whole, checked entry whose payload is no program
        key = entry.stem
        from backends import diskcache

        diskcache.write_entry(entry, key, b"not a pickle at all")
    else:
        entry.write_bytes(b"")
    _, cp = _first_call(MATMUL_ADD, x)  # (checked equal to the interpreter)
    assert _status(cp) == "miss" and lowered[0] == 2
    _, again = _first_call(MATMUL_ADD, x)  # rewritten: whole again
    assert _status(again) == "hit" and lowered[0] == 2


def test_a_damaged_object_entry_under_a_good_program_entry_is_rebuilt(cache):
    tmp, lowered = cache
    x = _inputs()
    _, cold = _first_call(MATMUL_ADD, x)
    for f in tmp.glob("*.o"):
        raw = bytearray(f.read_bytes())
        raw[-10] ^= 0xFF
        f.write_bytes(bytes(raw))
    _, cp = _first_call(MATMUL_ADD, x)  # the program from its entry, the object built again
    assert _status(cp) == "hit" and cp.library.extra["cache"] == "miss" and lowered[0] == 1
    _, again = _first_call(MATMUL_ADD, x)
    assert _status(again) == "hit" and again.library.extra["cache"] == "hit"


SCRIPT = r"""
import json, sys
import numpy as np
from backends import driver
counts = {"lower": 0, "optimize": 0}
real_lower, real_optimized = driver.lower, driver.optimized
def lower(*a, **k):
    counts["lower"] += 1
    return real_lower(*a, **k)
def optimized(*a, **k):
    counts["optimize"] += 1
    return real_optimized(*a, **k)
driver.lower, driver.optimized = lower, optimized
mode = sys.argv[1]
if mode == "compile":
    import tile
    src = sys.argv[2]
    x = {"A": np.arange(35, dtype=np.float32).reshape(5, 7) % 4, "B": np.eye(7, 6, dtype=np.float32),
         "C": np.ones((5, 6), np.float32)}
    got = tile.compile(src, "llvm_cpu.0")(x)["O"]
    ok = bool(np.array_equal(got, tile.compile(src, "interp")(x)["O"]))
else:
    import torch
    import tile.torch as tt
    op = tt.op(sys.argv[2])
    a = torch.arange(35, dtype=torch.float32).reshape(5, 7).remainder(4).requires_grad_()
    b = torch.eye(7, 6).requires_grad_()
    c = torch.ones(5, 6, requires_grad=True)
    out = op(a, b, c)
    out.backward(torch.ones_like(out))
    want = (a.detach() @ b.detach() + 1, torch.ones(5, 6) @ b.detach().T, a.detach().T @ torch.ones(5, 6))
    got = (out.detach(), a.grad, b.grad)
    ok = all(bool(torch.equal(g, w)) for g, w in zip(got, want))
print(json.dumps({"ok": ok, **counts}))
"""


def _process(cache: Path, mode: str) -> dict:
    env = {**os.environ, "TILE_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode, MATMUL_ADD], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_new_process_lowers_nothing_it_built_before(tmp_path):
    cold = _process(tmp_path, "compile")
    assert cold == {"ok": True, "lower": 1, "optimize": 1}
    warm = _process(tmp_path, "compile")
    assert warm == {"ok": True, "lower": 0, "optimize": 0}


def test_a_torch_op_forward_and_backward_in_a_new_process_lower_nothing(tmp_path):
    pytest.importorskip("torch", reason="tile.torch needs PyTorch")
    cold = _process(tmp_path, "torch")
    assert cold["ok"] and cold["lower"] == 2  # the forward program and its gradient program
    warm = _process(tmp_path, "torch")
    assert warm == {"ok": True, "lower": 0, "optimize": 0}


RUNTIME = r"""
import json
import numpy as np
import llvmlite.binding as llvm
import tile
from backends.llvm import threads
built = [0]
real = llvm.parse_assembly
def parse(text, *a, **k):
    built[0] += "tile_worker" in text
    return real(text, *a, **k)
llvm.parse_assembly = parse
src = "function (A[N, M]) -> (O) { O = A * 3 + 1; }"
a = (np.arange(512 * 256) % 7).astype(np.float32).reshape(512, 256)
cp = tile.compile(src, "llvm_cpu.0", {"min_parallel_points": 1}).prepare(A=a)
got = tile.compile(src, "llvm_cpu.0", {"min_parallel_points": 1})(A=a)["O"]
split = any(len(k.ranges()) > 1 for k in cp.kernels)
print(json.dumps({"ok": bool(np.array_equal(got, a * 3 + 1)), "split": split, "runtime_built": built[0]}))
"""


def test_the_thread_runtime_comes_from_the_cache_in_a_new_process(tmp_path):
    if not __import__("backends.llvm.threads", fromlist=["available"]).available():
        pytest.skip("no native thread pool here (POSIX semaphores missing): no runtime to build")
    env = {**os.environ, "TILE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO), "TILE_NUM_THREADS": "2"}
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", RUNTIME], cwd=REPO, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold == {"ok": True, "split": True, "runtime_built": 1}
    assert warm == {"ok": True, "split": True, "runtime_built": 0}, "the runtime was built again"


@pytest.mark.parametrize("snap", [{}, {"key": "0" * 64}, None], ids=["empty", "partial", "none"])
def test_a_snapshot_of_another_shape_restores_nothing(cache, snap):
    from backends import registry

    x = _inputs()
    _, cp = _first_call(MATMUL_ADD, x)
    device = registry.get("llvm_cpu.0")
    good = device.compiler.snapshot(cp.library)
    assert device.compiler.restore(cp.infos, {}, good) is not None
    assert device.compiler.restore(cp.infos, {}, snap) is None
    assert device.compiler.restore(cp.infos[:-1], {}, good) is None  # another kernel list
