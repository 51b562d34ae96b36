"""``python -m tile emit --stage optimized``, as a user runs it: targets, configs, --after, --report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONV_RELU = """function (I[N, H, W, CI], K[KH, KW, CI, CO], B[CO]) -> (O) {
    C[n, x, y, co: N, H, W, CO] = +(I[n, x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]);
    O = relu(C + B);
}
"""
SHAPES = ["--shape", "I=1x48x48x32", "--shape", "K=3x3x32x64", "--shape", "B=64"]


def emit(tmp_path, *args: str) -> subprocess.CompletedProcess:
    src = tmp_path / "conv.tile"
    src.write_text(CONV_RELU)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tile", "emit", str(src), "--stage", "optimized", *SHAPES, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_accel_shows_the_seeds_picture_with_a_report(tmp_path):
    run = emit(tmp_path, "--config", str(REPO / "stripe/targets/accel.json"), "--report")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    # the conv is tiled for the CONV unit: an outer block over tiles holding a CONV_inner block
    conv = re.search(r"#CONV .*block<CONV> \[(.*?)\]", out)
    inner = re.search(r"#CONV_inner block<CONV> \[(.*?)\]", out)
    assert conv and inner, out
    sizes = dict(re.findall(r"(\w+):(\d+)(?! =)", inner.group(1)))
    assert int(sizes["x"]) < 48 or int(sizes["y"]) < 48  # a tile, not the whole image
    # its inputs arrive in SRAM through DMA transfer blocks, and allocations have arena offsets
    assert re.search(r"#xfer block<DMA> \[", out) and "none<SRAM> @0x" in out and "<SRAM>" in out
    # the report: estimated cycles and bytes per memory level, per kernel and in total
    header = next(line for line in out.splitlines() if line.startswith("kernel"))
    assert "bytes DRAM" in header and "bytes SRAM" in header and "cycles" in header
    assert re.search(r"estimated \d+ cycles = [\d.]+ us at 1000 MHz", out)


def test_every_target_prints_and_after_stops_early(tmp_path):
    for target in ("llvm_cpu.0", "opencl_gpu.0", "llvm_cpu_tiled", "opencl_gpu_tiled", "accel"):
        run = emit(tmp_path, "--target", target)
        assert run.returncode == 0, (target, run.stderr)
        assert run.stdout.startswith("0: #program block")
    whole = emit(tmp_path, "--target", "accel").stdout
    early = emit(tmp_path, "--target", "accel", "--after", "tile_conv").stdout
    assert "#CONV_inner" in early and "#xfer" not in early and "#xfer" in whole
    strict = emit(tmp_path, "--target", "accel", "--strict").stdout
    assert "#CONV_inner" not in strict  # autotile and cache may reorder sums: skipped


def test_a_bad_config_is_a_located_error(tmp_path):
    cfg = json.loads((REPO / "stripe/targets/accel.json").read_text())
    cfg["passes"][2]["params"]["memory"] = 3
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg, indent=2))
    run = emit(tmp_path, "--config", str(path))
    assert run.returncode == 1
    first = run.stderr.splitlines()[0]
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: config error: passes\[2\]\.params\.memory: expected a "
                    r"string, got the integer 3", first), run.stderr
    assert "^" in run.stderr and "hint:" in run.stderr
    run = emit(tmp_path, "--target", "accel", "--after", "nope")
    assert run.returncode == 1 and "has no pass step named 'nope'" in run.stderr


def test_stage_config_prints_a_config_resolved_which_reads_back_equal(tmp_path):
    """``emit --stage config`` needs no program: a built-in delta (opencl_cpu extends opencl_gpu)
    prints whole, and a user's config extending it prints with its edit applied."""
    from stripe.config import parse_config, target_config

    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def config(*args: str) -> str:
        cmd = [sys.executable, "-m", "tile", "emit", "--stage", "config", *args]
        run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout

    text = config("--target", "opencl_cpu")
    assert "extends" not in json.loads(text)
    builtin = target_config("opencl_cpu")
    assert parse_config(text, builtin.source) == builtin
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"extends": "opencl_cpu", "name": "mine", "remove": ["tile_gemms"]}))
    resolved = json.loads(config("--config", str(mine)))
    assert resolved["name"] == "mine"
    steps = [s["name"] for s in json.loads(text)["passes"]]
    assert [s["name"] for s in resolved["passes"]] == [s for s in steps if s != "tile_gemms"]
