"""The GPU configs after NVIDIA's parts moved out (issue 39): a vendor-neutral ``gpu``, NVIDIA's
``cuda`` over it, ``opencl_gpu`` over ``cuda``, and ``opencl_cpu`` over ``gpu``.

``tests/configs_before_39/`` keeps the two OpenCL configs as they were (``opencl_gpu`` a complete
file holding the tensor cores and their PTX instruction strings, ``opencl_cpu`` deleting them from
it): today's resolve to the same settings, and the instruction that ``backends.cuda.mma`` now
derives from an operation's shape and types is the one the old table wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends.cuda.mma import instruction
from stripe.config import TARGETS, ConfigError, format_config, load_config, parse_config, target_config
from stripe.passes import PASSES

BEFORE = Path(__file__).resolve().parent / "configs_before_39"


def settings(cfg) -> dict:
    """A resolved config as the file format writes it, without what only names or documents it."""
    data = json.loads(format_config(cfg))
    for k in ("name", "description", "pass_modules"):
        data.pop(k, None)
    data["passes"] = [s for s in data["passes"] if s["name"] not in ("attention", "attention_backward")]  # 41
    return data


@pytest.fixture(scope="module")
def before(tmp_path_factory) -> dict[str, dict]:
    """The old opencl_gpu and opencl_cpu resolved, the old ``instruction`` strings taken out (each
    checked against ``backends.cuda.mma.instruction`` first)."""
    cuda = target_config("cuda").hardware.matrix_units["tensor_core"]  # (registers kmajor too)
    old = json.loads((BEFORE / "opencl_gpu.json").read_text())
    shapes = old["hardware"]["matrix_units"]["tensor_core"]["shapes"]
    assert set(shapes) == set(cuda.shapes) == {"f16", "bf16", "tf32"}
    for mode, shape in shapes.items():
        assert shape.pop("instruction") == instruction(cuda.shapes[mode]), mode
    unit = old["hardware"]["matrix_units"]["tensor_core"]  # the launched kernel's facts: now the
    wg = unit["warpgroup"]  # unit's ``backend`` entry (backends.cuda.launched), no longer stripe's
    keys = ("tiles", "k_bytes", "modes", "fold_tiles")
    unit["backend"] = {"launch": {k: wg.pop(f"launch_{k}") for k in keys}}
    folder = tmp_path_factory.mktemp("before")
    (folder / "opencl_gpu.json").write_text(json.dumps(old))
    (folder / "opencl_cpu.json").write_text((BEFORE / "opencl_cpu.json").read_text())
    return {n: settings(load_config(folder / f"{n}.json")) for n in ("opencl_gpu", "opencl_cpu")}


def test_opencl_gpu_resolves_to_the_settings_it_had(before):
    """The same settings, but for one changed since on purpose: ``split_reductions.min_free``
    (half GEMMs with rows on both sides go to the tensor cores, not split: M = 16 x 4096 x 4096
    0.162 -> 0.047 ms on an H100)."""
    had = before["opencl_gpu"]
    (split,) = [s for s in had["passes"] if s["name"] == "split_reductions"]
    assert split["params"]["min_free"] == 0  # (the default the old file did not name)
    split["params"]["min_free"] = 2
    assert settings(target_config("opencl_gpu")) == had
    assert settings(target_config("cuda")) == had  # opencl_gpu adds no setting


def test_opencl_cpu_resolves_to_its_settings_less_the_vendors_step(before):
    """Only ``kmajor_b`` goes: on a config without matrix units it never changed a program (the
    pass leaves a kernel alone when the hardware lacks the unit it names)."""
    old = before["opencl_cpu"]
    (kmajor,) = [s for s in old["passes"] if s["name"] == "kmajor_b"]
    assert not old["hardware"].get("matrix_units") and kmajor["params"]["unit"] == "tensor_core"
    old["passes"].remove(kmajor)
    assert settings(target_config("opencl_cpu")) == old


def test_the_gpu_config_and_opencl_cpu_name_no_vendor():
    files = {n: json.loads((TARGETS / f"{n}.json").read_text()) for n in ("gpu", "opencl_cpu", "cuda")}
    assert "extends" not in files["gpu"] and files["opencl_cpu"]["extends"] == "gpu"
    assert files["cuda"]["extends"] == "gpu" and files["cuda"]["pass_modules"] == ["backends.cuda.kmajor"]
    for name in ("gpu", "opencl_cpu"):
        cfg = target_config(name)
        assert not cfg.hardware.matrix_units and not cfg.pass_modules, name
        modules = {PASSES[s.pass_].fn.__module__ for s in cfg.passes}
        assert all(m.startswith("stripe.passes.") for m in modules), (name, modules)
        assert "NVIDIA" not in format_config(cfg) and "tensor" not in format_config(cfg), name


def test_loading_a_neutral_config_loads_no_vendor_code_and_cuda_registers_its_pass():
    code = (
        "import sys\n"
        "from stripe.config import target_config\n"
        "from stripe.passes import PASSES\n"
        "target_config('opencl_cpu'); target_config('gpu')\n"
        "assert 'kmajor' not in PASSES, 'kmajor before cuda'\n"
        "assert not [m for m in sys.modules if m.startswith('backends')], 'a backend was imported'\n"
        "cfg = target_config('opencl_gpu')\n"
        "assert 'kmajor' in PASSES and 'backends.cuda.kmajor' in sys.modules\n"
        "assert cfg.pass_modules == ('backends.cuda.kmajor',)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_pass_modules_round_trip_and_a_missing_module_is_located(tmp_path):
    cfg = target_config("opencl_gpu_tiled")
    assert cfg.pass_modules == ("backends.cuda.kmajor",)  # a base's modules count
    again = parse_config(format_config(cfg), cfg.source)
    assert again == cfg and again.pass_modules == cfg.pass_modules
    path = tmp_path / "mine.json"
    mine = {"extends": "gpu", "name": "mine", "pass_modules": ["backends.nowhere"]}
    path.write_text(json.dumps(mine, indent=1))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    e = info.value
    assert "cannot import the pass module 'backends.nowhere'" in e.message and "registers passes" in e.hint
    lines = path.read_text().splitlines()
    assert e.span is not None and lines[e.span.line - 1].strip() == '"backends.nowhere"'  # at its name
    path.write_text(json.dumps({"extends": "gpu", "name": "mine", "pass_modules": "backends.cuda.kmajor"}))
    with pytest.raises(ConfigError):  # a list of names, not one
        load_config(path)
