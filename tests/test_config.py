"""Target configs and the pass pipeline: located config errors, --after, strict, TILE_DEBUG=2."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from stripe.config import ConfigError, builtin_names, load_config, parse_config, target_config
from stripe.passes import PASSES, optimize, register, steps
from stripe.passes.registry import PassInfo
from tests.pass_support import lowered

GOOD = {
    "name": "mine",
    "hardware": {
        "clock_mhz": 1000,
        "mem_units": {"DRAM": {"size_KiB": 1024}},
        "exec_units": {"CPU": {"count": 4, "ops_per_cycle": 8}},
    },
    "passes": [
        {"name": "where", "pass": "locate_block", "params": {"reqs": ["contraction"], "loc": {"name": "CPU"}}}
    ],
}

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def write(tmp_path, data) -> str:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(data, indent=2) if not isinstance(data, str) else data)
    return str(path)


def test_every_builtin_config_loads_with_its_hardware_model():
    assert {"llvm_cpu", "opencl_gpu", "accel"} <= set(builtin_names())
    for name in builtin_names():
        cfg = target_config(name)
        assert cfg.name == name and cfg.hardware.clock_mhz > 0
        assert cfg.hardware.mem_units and cfg.hardware.exec_units
        for spec in cfg.passes:
            assert spec.pass_ in PASSES and isinstance(spec.params, PASSES[spec.pass_].config)
    accel = target_config("accel").hardware
    assert accel.mem_units["SRAM"].count == 4 and "DMA" in accel.tx_units
    assert accel.bandwidth("DMA", "SRAM") == 64 and accel.bandwidth("NOC", "SRAM") == 512
    assert target_config("llvm_cpu.3").name == "llvm_cpu"  # a device id names its kind's config


def test_a_users_file_loads_and_types_are_checked(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.hardware.exec_units["CPU"].ops_per_cycle == 8
    assert cfg.hardware.mem_units["DRAM"].line_bytes == 64  # the default
    (spec,) = cfg.passes
    assert spec.params.loc.name == "CPU" and spec.params.reqs == ("contraction",)


def _edit(path: tuple, value) -> dict:
    data = json.loads(json.dumps(GOOD))
    node = data
    for p in path[:-1]:
        node = node[p]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value, message, caret, hint",
    [
        (("passes", 0, "pass"), "autotiel", "unknown pass 'autotiel'", '"autotiel"', "the passes are:"),
        (("passes", 0, "params", "loc", "name"), 7, "passes[0].params.loc.name: expected a string, got "
         "the integer 7", "7", 'write "..."'),
        (("passes", 0, "params", "reqs"), "contraction", "expected a list", '"contraction"', "write [...]"),
        (("passes", 0, "params", "loc"), KeyError, "lacks the key 'loc'", "{", 'add "loc"'),
        (("passes", 0, "params", "colour"), 1, "unknown key 'colour'", '"colour"', "the keys are: loc, reqs"),
        (("hardware", "clock_mhz"), "fast", "hardware.clock_mhz: expected a number", '"fast"',
         "write a number"),
        (("hardware", "exec_units", "CPU", "count"), 2.5, "expected an integer, got the number 2.5", "2.5",
         "whole number"),
        (("hardware", "mem_units"), KeyError, "'hardware' lacks the key 'mem_units'", "{", 'add "mem_units"'),
    ],
)
def test_config_errors_point_at_the_key_with_a_fix(tmp_path, path, value, message, caret, hint):
    file = write(tmp_path, _edit(path, value))
    with pytest.raises(ConfigError) as info:
        load_config(file)
    e = info.value
    text = str(e)
    assert message in e.message and hint in e.hint, text
    lines = text.splitlines()
    assert lines[0].startswith(f"{file}:{e.span.line}:{e.span.col}: config error:")
    shown = lines[1][4:]
    assert shown[e.span.col - 1:].startswith(caret), text
    assert lines[2].index("^") == 4 + e.span.col - 1


def test_invalid_json_and_missing_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not valid JSON") as info:
        load_config(write(tmp_path, '{"name": "x",\n "passes": [}'))
    assert info.value.span.line == 2
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="no built-in optimizer config for target 'tpu.0'"):
        target_config("tpu.0")


def test_after_stops_at_a_step_and_an_unknown_step_is_an_error():
    cfg = parse_config(json.dumps(GOOD))
    program = lowered(MATMUL, {"A": (2, 3), "B": (3, 4)})
    out = optimize(program, cfg, after="where")
    kernels = out.stmts[0].stmts
    assert [k.location.name for k in kernels if "contraction" in k.tags] == ["CPU"]
    assert optimize(program, cfg, after="locate_block") == out  # a pass name stops there too
    with pytest.raises(ConfigError, match="no pass step named 'nope'") as info:
        optimize(program, cfg, after="nope")
    assert "where" in info.value.hint


@pytest.fixture
def reordering_pass():
    """A test-only pass registered as reordering, to see strict mode skip it."""

    @register("test_reorders", type(target_config("accel").passes[0].params), reorders=True)
    def test_reorders(program, cfg, hw):
        return replace(program, comments=("touched",))

    yield PASSES["test_reorders"]
    del PASSES["test_reorders"]


def test_strict_skips_passes_that_reorder_aggregation(reordering_pass: PassInfo):
    data = _edit(("passes", 0, "pass"), "test_reorders")
    cfg = parse_config(json.dumps(data))
    program = lowered(MATMUL, {"A": (2, 3), "B": (3, 4)})
    assert optimize(program, cfg).comments == ("touched",)
    assert optimize(program, cfg, strict=True) == program
    assert [s.name for s, _, _ in steps(program, cfg, strict=True)] == []


def test_tile_debug_2_prints_each_step_with_its_time_and_program(tmp_path):
    src = tmp_path / "mm.tile"
    src.write_text(MATMUL)
    cfg = write(tmp_path, GOOD)
    run = subprocess.run(
        [sys.executable, "-m", "tile", "emit", str(src), "--stage", "optimized", "--config", cfg,
         "--shape", "A=2x3", "--shape", "B=3x4"],
        capture_output=True, text=True, env={**__import__("os").environ, "TILE_DEBUG": "2"},
    )
    assert run.returncode == 0, run.stderr
    assert "=== where (locate_block): " in run.stderr and " ms" in run.stderr
    assert "block<CPU>" in run.stderr.split("=== where")[1]
    assert "block<CPU>" in run.stdout


def test_compile_takes_a_config_file_or_a_builtin_name(tmp_path):
    import numpy as np

    import tile

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = a @ a.T
    for config in ("llvm_cpu_tiled", "accel", write(tmp_path, GOOD)):
        f = tile.compile(MATMUL, "llvm_cpu.0", settings={"config": config})
        np.testing.assert_array_equal(f(A=a, B=a.T)["C"], want)
    with pytest.raises(ConfigError, match="cannot read config file 'nope'") as info:
        tile.compile(MATMUL, "llvm_cpu.0", settings={"config": "nope"})
    assert "llvm_cpu_tiled" in info.value.hint


def test_strict_keeps_float_results_bit_identical_to_the_interpreter():
    """Tiling the reduction changes the order of a float sum; strict mode skips the passes that do
    so, and the compiled result equals the interpreter's bit for bit."""
    import numpy as np

    import ref_interp
    import tile
    from backends import registry
    from backends.driver import compile_bound
    from ref_interp.run import input_types
    from stripe.ir import walk
    from tile.bind import bind

    src = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((40, 300)) * 1e3).astype(np.float32)
    b = rng.standard_normal((300, 30)).astype(np.float32)
    want = ref_interp.run(src, {"A": a, "B": b})["C"]
    settings = {"config": "llvm_cpu_tiled", "strict": True}
    got = tile.compile(src, "llvm_cpu.0", settings)(A=a, B=b)["C"]
    assert got.tobytes() == want.tobytes()
    p = tile.parse(src)
    bound = bind(p, input_types(p, {"A": a, "B": b}))
    device = registry.get("llvm_cpu.0")
    unoptimized = compile_bound(bound, device, {"optimize": False}).program
    assert compile_bound(bound, device, settings).program == unoptimized
    tiled = compile_bound(bound, device, {"config": "llvm_cpu_tiled"}).program
    assert any("tile" in blk.tags for blk in walk(tiled))  # without strict, the reduction is tiled


def test_an_opencl_device_compiles_with_the_config_of_its_kind():
    """A CPU OpenCL device (PoCL) takes ``opencl_cpu`` (long reductions split into contiguous
    chunks, one per core and more), a GPU ``opencl_gpu`` (interleaved lanes); both run the
    Stripe-tiled GPU pipeline in conformance."""
    from backends import registry
    from tests.opencl_support import DEVICE_ID

    if DEVICE_ID is None:
        pytest.skip("no usable OpenCL device (pyopencl or an OpenCL driver is missing)")
    dev = registry.get(DEVICE_ID)
    kind = "cpu" if DEVICE_ID.startswith("opencl_cpu") else "gpu"
    assert dev.optimizer == f"opencl_{kind}" and dev.tiled_optimizer == "opencl_gpu_tiled"
    splits = {
        name: [s.params for s in target_config(name).passes if s.pass_ == "split_reduction"]
        for name in ("opencl_cpu", "opencl_gpu")
    }
    assert [p.interleave for p in splits["opencl_cpu"]] == [False]
    assert [p.interleave for p in splits["opencl_gpu"]] == [True]
