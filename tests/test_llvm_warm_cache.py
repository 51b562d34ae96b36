"""A new process calling a program built before (warm disk cache) generates, parses and optimizes
no LLVM IR: the object code and the kernels' plan come from the entry keyed by the plan
(``backends.llvm.cache.plan_key``). Calls are counted, not timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
import numpy as np
import llvmlite.binding as llvm
import tile
from backends.llvm import device

counts = {"generate": 0, "optimize": 0}
real_generate, real_builder = device.generate, llvm.create_pass_builder

def generate(*a, **k):
    counts["generate"] += 1
    return real_generate(*a, **k)

def builder(*a, **k):
    counts["optimize"] += 1
    return real_builder(*a, **k)

device.generate = generate
llvm.create_pass_builder = builder
src = sys.argv[1]
x = {"A": np.arange(64, dtype=np.float32).reshape(8, 8) % 5, "B": np.eye(8, dtype=np.float32)[::-1].copy()}
exe = tile.compile(src, "llvm_cpu.0")
cp = exe.prepare(**x)
out = exe(x)
want = tile.compile(src, "interp")(x)
ok = all(np.array_equal(out[k], want[k]) for k in want)
print(json.dumps({"cache": cp.library.extra["cache"], "ok": ok, **counts, "source": len(cp.library.source)}))
"""

PROGRAM = """function (A[N, N], B[N, N]) -> (C, D, E) {
  C[i, j: N, N] = +(A[i, l] * B[l, j]);
  D[i, j: N, N] = +(B[i, l] * A[l, j]);
  E = C + D;
}"""


def _run(cache: Path, src: str) -> dict:
    env = {**os.environ, "TILE_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, src], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_new_process_with_a_warm_cache_generates_and_optimizes_nothing(tmp_path):
    cold = _run(tmp_path, PROGRAM)
    assert cold["ok"] and cold["cache"] == "miss" and cold["generate"] == 1 and cold["optimize"] == 1
    warm = _run(tmp_path, PROGRAM)
    assert warm["ok"] and warm["cache"] == "hit"
    assert warm["generate"] == 0 and warm["optimize"] == 0, warm
    assert warm["source"] == cold["source"] > 0  # the IR text comes back with the entry
    changed = _run(tmp_path, PROGRAM.replace("E = C + D", "E = C - D"))
    assert changed["ok"] and changed["cache"] == "miss" and changed["generate"] == 1


def test_a_corrupted_plan_entry_is_rebuilt(tmp_path):
    cold = _run(tmp_path, PROGRAM)
    assert cold["cache"] == "miss"
    for f in tmp_path.glob("*.o"):
        raw = bytearray(f.read_bytes())
        raw[-10] ^= 0xFF
        f.write_bytes(bytes(raw))
    again = _run(tmp_path, PROGRAM)
    assert again["ok"] and again["cache"] == "miss" and again["generate"] == 1
