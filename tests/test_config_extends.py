"""Target configs by composition: ``"extends"`` with its edits (add, replace, params, remove,
hardware merge), chains of bases, every mistake located in the file that has it, the built-in
targets written as a base plus deltas, ``format_config`` and the import order of the config data."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import ref_interp
import tile
from stripe.config import (
    TARGETS,
    ConfigError,
    builtin_names,
    format_config,
    load_config,
    parse_config,
    resolve_config,
    target_config,
)
from stripe.passes import PASSES

HW = {
    "clock_mhz": 1000,
    "mem_units": {"DRAM": {"size_KiB": 1024}, "SRAM": {"size_KiB": 64, "count": 4}},
    "exec_units": {"CPU": {"count": 4, "ops_per_cycle": 8}},
    "buses": [{"sources": ["DRAM[0]"], "sinks": ["SRAM[0]"], "bytes_per_cycle": 16}],
}
BASE = {
    "name": "base",
    "description": "the base",
    "device": "llvm_cpu.0",
    "hardware": HW,
    "passes": [
        {"name": "fuse", "pass": "fusion",
         "params": {"a_reqs": ["eltwise"], "b_reqs": ["eltwise"], "max_refs": 8}},
        {"name": "localize", "pass": "localize", "params": {"reqs": ["main"]}},
        {"name": "dead", "pass": "dead_code", "params": {"reqs": ["program"]}},
    ],
}
CLEANUP = ["localize_main", "inline_main", "scalarize_main", "dead_code", "prune_refs", "prune_indexes",
           "reduce_constraints"]


def write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return path


def extend(tmp_path: Path, **edits):
    write(tmp_path, "base.json", BASE)
    return load_config(write(tmp_path, "mine.json", {"extends": "base.json", **edits}))


def names(cfg) -> list[str]:
    return [s.name for s in cfg.passes]


def step(name: str, pass_: str = "localize", reqs=("main",)) -> dict:
    return {"name": name, "pass": pass_, "params": {"reqs": list(reqs)}}


# ------------------------------------------------------------------------------ the forms
def test_without_edits_an_extending_config_is_its_base_under_its_own_name(tmp_path):
    base = load_config(write(tmp_path, "base.json", BASE))
    cfg = extend(tmp_path, name="mine")
    assert cfg.name == "mine" and cfg.source == str(tmp_path / "mine.json")
    assert (cfg.hardware, cfg.passes, cfg.device, cfg.description) == (
        base.hardware, base.passes, base.device, base.description
    )
    assert extend(tmp_path).name == "base"  # what the file does not give is the base's


def test_add_after_before_and_at_the_end_in_the_order_listed(tmp_path):
    cfg = extend(tmp_path, add=[
        {"after": "fuse", "steps": [step("a1"), step("a2")]},
        {"before": "fuse", "steps": [step("b1")]},
        {"steps": [step("end", "dead_code", ["program"])]},
        {"after": "a2", "steps": [step("after_added")]},  # a step an earlier addition added
    ])
    assert names(cfg) == ["b1", "fuse", "a1", "a2", "after_added", "localize", "dead", "end"]
    assert cfg.passes[-1].pass_ == "dead_code" and cfg.passes[-1].params.reqs == ("program",)


def test_replace_a_whole_step_keeping_or_changing_its_name(tmp_path):
    new = {"pass": "scalarize", "params": {"reqs": ["kernel"]}}
    cfg = extend(tmp_path, replace={"localize": new})
    assert names(cfg) == ["fuse", "localize", "dead"]
    assert cfg.passes[1].pass_ == "scalarize" and cfg.passes[1].params.reqs == ("kernel",)
    cfg = extend(tmp_path, replace={"localize": {"name": "scalarize_kernels", **new}})
    assert names(cfg) == ["fuse", "scalarize_kernels", "dead"]


def test_params_patch_a_step_and_null_gives_a_param_its_default(tmp_path):
    base = load_config(write(tmp_path, "base.json", BASE)).passes[0].params
    cfg = extend(tmp_path, params={"fuse": {"b_fully_fused": True, "max_refs": None}})
    fuse = cfg.passes[0].params
    assert fuse.b_fully_fused and fuse.max_refs is None and base.max_refs == 8
    assert fuse.a_reqs == base.a_reqs == ("eltwise",)  # what the patch does not name stays


def test_remove_steps_then_add_one_under_a_removed_name(tmp_path):
    cfg = extend(tmp_path, remove=["localize", "fuse"], add=[{"steps": [step("fuse", "inline")]}])
    assert names(cfg) == ["dead", "fuse"] and cfg.passes[1].pass_ == "inline"


def test_hardware_is_merged_key_by_key_null_deletes_and_lists_replace(tmp_path):
    cfg = extend(tmp_path, hardware={
        "clock_mhz": 2000,
        "mem_units": {"SRAM": {"size_KiB": 128}, "L1": {"size_KiB": 32}},
        "exec_units": {"CPU": None, "GPU": {"count": 2, "threads": 64}},
        "buses": [],
    })
    hw = cfg.hardware
    assert hw.clock_mhz == 2000 and hw.buses == ()
    assert hw.mem_units["SRAM"].size_KiB == 128 and hw.mem_units["SRAM"].count == 4  # count kept
    assert hw.mem_units["DRAM"].size_KiB == 1024 and hw.mem_units["L1"].size_KiB == 32
    assert list(hw.exec_units) == ["GPU"] and hw.exec_units["GPU"].threads == 64


def test_name_description_and_device_are_overridden_or_removed(tmp_path):
    cfg = extend(tmp_path, name="x", description="mine", device="opencl_gpu.0")
    assert (cfg.name, cfg.description, cfg.device) == ("x", "mine", "opencl_gpu.0")
    assert extend(tmp_path, device=None).device == ""


def test_passes_in_an_extending_config_replace_the_whole_list(tmp_path):
    cfg = extend(tmp_path, passes=[step("only")])
    assert names(cfg) == ["only"] and cfg.hardware.clock_mhz == 1000


def test_a_chain_of_bases_in_folders_resolves_relative_paths_from_each_file(tmp_path):
    write(tmp_path, "lib/base.json", BASE)
    write(tmp_path, "lib/mid.json", {"extends": "base.json", "name": "mid", "remove": ["dead"],
                                     "hardware": {"clock_mhz": 1500}})
    top = write(tmp_path, "cfg/top.json", {"extends": "../lib/mid.json", "name": "top",
                                           "add": [{"steps": [step("last", "inline")]}]})
    cfg = load_config(top)
    assert cfg.name == "top" and names(cfg) == ["fuse", "localize", "last"]
    assert cfg.hardware.clock_mhz == 1500 and cfg.description == "the base"
    assert load_config(tmp_path / "lib/mid.json").name == "mid"


def test_a_users_config_extends_a_builtin_and_compiles_like_the_interpreter(tmp_path):
    path = write(tmp_path, "mine.json", {
        "extends": "llvm_cpu",
        "name": "mine",
        "remove": ["tile_gemms", "self_init"],
        "params": {"fuse_eltwise": {"max_refs": 4}},
    })
    cfg = resolve_config(str(path))
    builtin = target_config("llvm_cpu")
    assert cfg.name == "mine" and cfg.hardware == builtin.hardware
    assert names(cfg) == [n for n in names(builtin) if n not in ("tile_gemms", "self_init")]
    assert next(s for s in cfg.passes if s.name == "fuse_eltwise").params.max_refs == 4
    src = """function (A[M, K], B[K, N], C[N]) -> (R) {
        T[i, j: M, N] = +(A[i, k] * B[k, j]);
        R = relu(T + C) * 2;
    }"""
    rng = np.random.default_rng(5)
    inputs = {"A": rng.integers(-4, 5, (9, 13)).astype(np.float32),
              "B": rng.integers(-4, 5, (13, 7)).astype(np.float32),
              "C": rng.integers(-4, 5, (7,)).astype(np.float32)}
    want = ref_interp.run(src, inputs)["R"]
    got = tile.compile(src, "llvm_cpu.0", settings={"config": str(path)})(**inputs)["R"]
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ located mistakes
def located(e: ConfigError, file: Path, needle: str | re.Pattern, hint: str, nth: int = 0) -> None:
    """The error points at the ``nth`` occurrence of ``needle`` in ``file`` (of a pattern's
    group 1 if it has one): its name, line and column, the line shown with a caret under it, and
    the hint."""
    text = file.read_text()
    pattern = needle if isinstance(needle, re.Pattern) else re.compile(re.escape(needle))
    m = list(pattern.finditer(text))[nth]
    at = m.start(1) if pattern.groups else m.start()
    line = text.count("\n", 0, at) + 1
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    shown = str(e).splitlines()
    assert shown[0].startswith(f"{file}:{line}:{col}: config error:"), str(e)
    assert shown[1][4:] == text.split("\n")[line - 1], str(e)
    assert shown[2].index("^") == 4 + col - 1, str(e)
    assert hint in e.hint, str(e)


def mistake(tmp_path, data, name="mine.json") -> tuple[ConfigError, Path]:
    write(tmp_path, "base.json", BASE)
    path = write(tmp_path, name, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value, path


@pytest.mark.parametrize(
    "edits, needle, message, hint",
    [
        ({"remove": ["nope"]}, '"nope"', "no step named 'nope'", "its steps are: fuse, localize, dead"),
        ({"remove": ["fuse", "fuse"]}, re.compile(r'"fuse"\s*\]'), "the step 'fuse' is removed",
         "its steps are: localize, dead"),
        ({"params": {"fuse": {}}, "remove": ["fuse"]}, re.compile(r'"params": \{\s*("fuse")'),
         "is removed (\"remove\" applies first)", "its steps are: localize, dead"),
        ({"replace": {"nope": step("x")}}, '"nope"', "no step named 'nope'", "its steps are:"),
        ({"params": {"nope": {"max_refs": 2}}}, '"nope"', "no step named 'nope'", "its steps are:"),
        ({"add": [{"after": "nope", "steps": []}]}, '"nope"', "no step named 'nope'", "its steps are:"),
        ({"add": [{"before": "nope", "steps": []}]}, '"nope"', "no step named 'nope'", "its steps are:"),
        ({"add": [{"steps": [step("dead")]}]}, '"dead"', "there already is a step named 'dead'",
         "step names are unique"),
        ({"replace": {"fuse": {"name": "dead", "pass": "inline"}}}, '"dead"', "already is a step named",
         "step names are unique"),
        ({"add": [{"after": "fuse", "before": "dead", "steps": []}]}, '"before"',
         "after a step or before one", 'keep "after" or "before"'),
        ({"add": [{"after": "fuse"}]}, re.compile(r'"add": \[\s*(\{)'), "an addition lacks the key 'steps'",
         'add "steps"'),
        ({"add": [{"at": "end", "steps": []}]}, '"at"', "unknown key 'at' in an addition",
         "after, before, steps"),
        ({"params": {"fuse": 3}}, "3", "expected an object, got the integer 3", "null: back to the default"),
        ({"params": {"fuse": {"max_refs": "many"}}}, '"many"', "params.fuse.max_refs: expected an integer",
         "write a whole number"),
        ({"params": {"fuse": {"colour": 1}}}, '"colour"',
         "unknown key 'colour' in the params of pass 'fusion'", "the keys are: a_gemm"),
        ({"replace": {"fuse": {"pass": "fusionn"}}}, '"fusionn"', "unknown pass 'fusionn'",
         "the passes are:"),
        ({"hardware": {"clock_mhz": "fast"}}, '"fast"', "hardware.clock_mhz: expected a number",
         "write a number"),
        ({"hardware": {"exec_units": {"CPU": {"count": 1.5}}}}, "1.5", "expected an integer", "whole number"),
        ({"passes": [step("a")], "remove": ["fuse"]}, '"remove"', "whole pass list or edits its base's",
         'drop "remove"'),
        ({"extends_": "base.json"}, '"extends_"', "unknown key 'extends_' in a config", "the keys are: add,"),
    ],
)
def test_a_mistake_in_an_edit_is_located_in_the_extending_file(tmp_path, edits, needle, message, hint):
    e, path = mistake(tmp_path, {"extends": "base.json", "name": "mine", **edits})
    assert message in e.message, str(e)
    located(e, path, needle, hint)


def test_an_unknown_base_an_unreadable_one_and_a_cycle_are_located_at_extends(tmp_path):
    e, path = mistake(tmp_path, {"extends": "llvm_gpu", "name": "x"})
    assert "no built-in config named 'llvm_gpu'" in e.message
    located(e, path, '"llvm_gpu"', "the built-in configs are accel, cuda, gpu, llvm_cpu")
    e, path = mistake(tmp_path, {"extends": "lib/absent.json", "name": "x"})
    assert f"cannot read the base config '{tmp_path / 'lib/absent.json'}'" in e.message
    located(e, path, '"lib/absent.json"', "relative path starts at the folder of this file")
    e, path = mistake(tmp_path, {"extends": 7})
    located(e, path, "7", 'write "..."')
    e, path = mistake(tmp_path, {"extends": "mine.json", "name": "x"})
    assert "the bases form a cycle" in e.message
    located(e, path, '"mine.json"', "cannot extend itself")
    write(tmp_path, "a.json", {"extends": "b.json", "name": "a"})
    b = write(tmp_path, "b.json", {"extends": "a.json"})
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "a.json")
    assert info.value.message.endswith(f"{tmp_path / 'a.json'} -> {b} -> {tmp_path / 'a.json'}")
    located(info.value, b, '"a.json"', "directly or through its bases")


def test_a_mistake_in_a_base_is_located_in_the_base(tmp_path):
    bad = json.loads(json.dumps(BASE))
    bad["passes"][1]["params"]["reqs"] = "main"
    base = write(tmp_path, "lib/bad.json", bad)
    e, _ = mistake(tmp_path, {"extends": "lib/bad.json", "name": "mine"})
    assert "passes[1].params.reqs: expected a list" in e.message
    located(e, base, '"main"', "write [...]")
    write(tmp_path, "lib/bad.json", '{"name": "b",\n  "passes": [}')
    e, _ = mistake(tmp_path, {"extends": "lib/bad.json"})
    assert "not valid JSON" in e.message and e.span.source.name == str(base) and e.span.line == 2


def test_edits_without_a_base_and_keys_missing_after_resolution_are_located(tmp_path):
    e, path = mistake(tmp_path, {**BASE, "remove": ["fuse"]})
    assert "'remove' edits the passes of a base, and there is none" in e.message
    located(e, path, '"remove"', '"extends": NAME or PATH')
    write(tmp_path, "nameless.json", {"hardware": HW, "passes": BASE["passes"]})
    e, path = mistake(tmp_path, {"extends": "nameless.json", "remove": ["dead"]})
    assert "a config lacks the key 'name'" in e.message
    located(e, path, "{", 'add "name" (here or in a config it extends)')


def test_a_bad_name_in_a_users_config_fails_compile_with_a_located_error(tmp_path):
    path = write(tmp_path, "mine.json", {"extends": "llvm_cpu", "name": "mine", "remove": ["self_inits"]})
    with pytest.raises(ConfigError) as info:
        tile.compile("function (A[N]) -> (B) { B = A + 1; }", "llvm_cpu.0", settings={"config": str(path)})
    located(info.value, path, '"self_inits"', "its steps are: pointwise, fuse_eltwise, split_reductions")


# ------------------------------------------------------------------------------ built-in targets
def test_the_builtin_targets_are_three_complete_files_and_their_deltas(tmp_path):
    assert builtin_names() == ["accel", "cuda", "gpu", "llvm_cpu", "llvm_cpu_tiled", "opencl_cpu",
                               "opencl_gpu", "opencl_gpu_tiled"]
    files = {n: json.loads((TARGETS / f"{n}.json").read_text()) for n in builtin_names()}
    complete = {n for n, data in files.items() if "extends" not in data}
    assert complete == {"accel", "llvm_cpu", "gpu"}
    for n in complete:  # tests and users read these as the whole format: every step written out
        assert {"name", "hardware", "passes"} <= set(files[n])
        assert all("pass" in s for s in files[n]["passes"])
    for n in set(builtin_names()) - complete:
        assert files[n]["extends"] in builtin_names() and "passes" not in files[n], n
        copy = write(tmp_path, f"copy/{n}.json", (TARGETS / f"{n}.json").read_text())
        assert load_config(copy) == replace(target_config(n), source=str(copy))  # by name: loads anywhere
    assert files["opencl_cpu"]["extends"] == "gpu"  # "the same passes as gpu, except...": no vendor's
    assert (files["cuda"]["extends"], files["opencl_gpu"]["extends"]) == ("gpu", "cuda")
    steps = {n: names(target_config(n)) for n in builtin_names()}
    for n, cfg_steps in steps.items():
        assert len(set(cfg_steps)) == len(cfg_steps), n
        if n != "accel":
            assert [s for s in cfg_steps if s in CLEANUP] == CLEANUP, n
    assert steps["llvm_cpu"][-2:] == ["tile_gemms", "self_init"]
    last = ["tile_gemms", "tile_transposes", "one_kernel_reductions"]
    assert steps["opencl_cpu"][-3:] == steps["gpu"][-3:] == last
    # (a K-major copy is transposed)
    assert steps["opencl_gpu"][-4:] == steps["cuda"][-4:] == ["kmajor_b", *last]
    assert steps["opencl_gpu_tiled"][:1] == steps["llvm_cpu_tiled"][1:2] == ["tile_contractions"]
    assert steps["llvm_cpu"][0] == steps["llvm_cpu_tiled"][0] == "pointwise"
    assert "tile_gemms" not in steps["llvm_cpu_tiled"] + steps["opencl_gpu_tiled"]
    after = {n: dict(zip(s, s[1:], strict=False)) for n, s in steps.items()}
    assert after["opencl_cpu"]["fuse_eltwise"] == "split_reductions"  # contiguous chunks, after fusion
    assert after["opencl_gpu"]["row_programs"] == "split_reductions"  # lanes, before fusion
    assert after["opencl_gpu_tiled"]["fuse_eltwise"] == "threads"
    assert after["llvm_cpu_tiled"]["order_tiles"] == "fuse_contraction_eltwise"


def test_builtin_configs_keep_what_the_backends_and_tests_rely_on():
    cfgs = {n: target_config(n) for n in builtin_names()}
    assert cfgs["llvm_cpu"].hardware == cfgs["llvm_cpu_tiled"].hardware
    assert cfgs["opencl_gpu"].hardware == cfgs["opencl_gpu_tiled"].hardware
    assert set(cfgs["llvm_cpu"].hardware.mem_units) == {"DRAM", "L2", "L1"}
    cpu = cfgs["opencl_cpu"].hardware
    assert list(cpu.mem_units) == ["GLOBAL", "LOCAL", "REGISTER"] and list(cpu.exec_units) == ["CPU"]
    assert cpu.mem_units["LOCAL"].size_KiB == 64 and cpu.bandwidth("GLOBAL", "LOCAL") == 16
    assert cfgs["opencl_gpu"].hardware.exec_units["GPU"].threads == 256

    def params(name, step_name):
        (p,) = [s.params for s in cfgs[name].passes if s.name == step_name]
        return p

    assert params("opencl_cpu", "row_programs").group == 64
    gpu_rows = params("opencl_gpu", "row_programs")
    assert (gpu_rows.group, gpu_rows.groups) == (1024, ((2048, 256), (16384, 512)))
    assert params("opencl_gpu", "tile_gemms").matrix_unit == "tensor_core"
    assert list(cfgs["opencl_gpu"].hardware.matrix_units) == ["tensor_core"]
    assert not cfgs["opencl_cpu"].hardware.matrix_units
    assert params("opencl_cpu", "split_reductions").interleave is False
    assert params("opencl_gpu", "split_reductions").interleave is True
    assert params("opencl_cpu", "fuse_eltwise").a_skip == () and params("opencl_gpu", "fuse_eltwise").a_skip
    assert params("llvm_cpu", "fuse_contraction_eltwise").a_gemm
    assert params("llvm_cpu_tiled", "fuse_contraction_eltwise").a_reqs == ("contraction", "tiled")
    assert params("opencl_gpu_tiled", "tile_contractions").memory == "LOCAL"
    assert all(c.description for c in cfgs.values())


# ------------------------------------------------------------------------------ format_config
@pytest.mark.parametrize("name", builtin_names())
def test_format_config_round_trips_every_builtin(name):
    cfg = target_config(name)
    text = format_config(cfg)
    data = json.loads(text)
    keys = ["name", "description", *(["pass_modules"] if cfg.pass_modules else []), "hardware", "passes"]
    assert list(data) == keys and "extends" not in text
    for written, spec in zip(data["passes"], cfg.passes, strict=True):
        assert set(written["params"]) == set(PASSES[spec.pass_].config.__dataclass_fields__)  # all params
    again = parse_config(text, cfg.source)
    assert again == cfg and repr(again) == repr(cfg) and again.description == cfg.description
    assert format_config(again) == text


def test_format_config_writes_device_and_nulls_and_reads_back(tmp_path):
    cfg = extend(tmp_path, name="mine", params={"fuse": {"max_refs": None}})
    text = format_config(cfg)
    assert list(json.loads(text)) == ["name", "description", "device", "hardware", "passes"]
    assert '"max_refs": null' in text and parse_config(text, cfg.source) == cfg


# ------------------------------------------------------------------------------ imports
def test_the_config_data_imports_none_of_the_passes():
    code = "import sys, stripe.config_types; print('stripe.passes' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
    for module in ("stripe.passes.pipeline", "stripe.config", "stripe.passes.autotile"):
        code = f"import {module}, stripe.config as c; print(len(c.target_config('llvm_cpu').passes))"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert run.returncode == 0 and run.stdout.strip() == "17", (module, run.stderr)
    tree = ast.parse(Path("stripe/config.py").read_text())
    local = [n for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert local == []  # no import inside a function to dodge a circle
