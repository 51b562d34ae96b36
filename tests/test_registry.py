"""Devices from the ``tile.devices`` entry point group, as a package outside the project gives them.

Each test writes a small distribution into a temporary folder (a module and a ``.dist-info`` with
its ``entry_points.txt``), puts the folder on ``sys.path`` and makes the registry look again: that
is all ``pip install`` does for a plugin. The plugin's good device is the host CPU under another id;
its bad entry points fail to import, raise, return what is not a device, or repeat an id.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tomllib

import tile
from backends import registry

ROOT = Path(__file__).resolve().parent.parent
MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"

MODULE = '''
from backends.llvm import LlvmCpuDevice


class PlugCpu(LlvmCpuDevice):
    """The host CPU under a plugin's id (what matters here is how it is found)."""

    def __init__(self):
        super().__init__()
        self.id = "plug_cpu.0"
        self.description = "a plugin's CPU device"


def good():
    return [PlugCpu()]


def raises():
    raise RuntimeError("the accelerator's driver is not loaded")


def not_devices():
    return ["not a device", 42]


def not_iterable():
    return 42


def repeats():
    dev = PlugCpu()
    dev.id = "llvm_cpu.0"
    return [dev]
'''

ENTRY_POINTS = """
[tile.devices]
plug = tile_test_plugin:good
plug_raises = tile_test_plugin:raises
plug_junk = tile_test_plugin:not_devices
plug_scalar = tile_test_plugin:not_iterable
plug_repeats = tile_test_plugin:repeats
plug_missing = tile_no_such_module:devices
"""


def write_plugin(folder: Path) -> Path:
    (folder / "tile_test_plugin.py").write_text(MODULE)
    info = folder / "tile_test_plugin-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tile-test-plugin\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    return folder


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"the test plugin's device is the LLVM CPU device: {registry.unavailable()}")
    monkeypatch.syspath_prepend(str(write_plugin(tmp_path)))
    registry.reset()
    yield tmp_path
    monkeypatch.undo()
    sys.modules.pop("tile_test_plugin", None)
    registry.reset()


def test_the_builtin_devices_come_from_the_entry_points_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["tile.devices"]
    assert declared == registry.BUILTIN
    names = {ep.name for ep in registry.entry_points()}
    assert set(declared) <= names


def test_a_plugin_device_is_listed_and_compiles(plugin):
    assert "plug_cpu.0" in registry.ids()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = tile.compile(MATMUL, "plug_cpu.0")(A=a, B=b)["C"]
    np.testing.assert_array_equal(got, a @ b)
    t = tile.tensor(a, device="plug_cpu.0")
    assert t.device == "plug_cpu.0"
    np.testing.assert_array_equal(t.numpy(), a)


def test_misbehaving_entry_points_are_listed_by_package_and_reason(plugin):
    why = registry.unavailable()
    assert "plug_cpu.0" in registry.devices() and "llvm_cpu.0" in registry.devices()
    assert "RuntimeError: the accelerator's driver is not loaded" in why["plug_raises"]
    assert "tile-test-plugin 1.2" in why["plug_raises"]
    assert "plug_raises = tile_test_plugin:raises" in why["plug_raises"]
    assert "ModuleNotFoundError" in why["plug_missing"]
    assert "not an iterable of devices" in why["plug_scalar"]
    junk = [w for k, w in why.items() if k.startswith("plug_junk:")]
    assert len(junk) == 2 and all("not a backends.hal.Device" in w for w in junk)
    repeat = [w for k, w in why.items() if "plug_repeats" in k]
    assert repeat and "repeats the id 'llvm_cpu.0'" in repeat[0]
    # the built-in device keeps its id: the plugin's copy was refused, not swapped in
    assert registry.get("llvm_cpu.0").description != "a plugin's CPU device"


def test_get_loads_only_the_entry_point_the_id_names(plugin):
    registry.reset()
    registry.get("plug_cpu.0")
    assert "plug_raises" not in registry._why_not  # not loaded: nothing asked for its devices


def test_an_unknown_id_is_a_device_error_listing_the_ids(plugin):
    with pytest.raises(tile.TileDeviceError) as e:
        tile.compile(MATMUL, "nosuch.0")
    message = str(e.value)
    assert message.startswith("device error: no device 'nosuch.0'")
    assert "plug_cpu.0" in message and "llvm_cpu.0" in message and "interp" in message
    with pytest.raises(tile.TileDeviceError, match="no device 'nosuch.0'"):
        tile.tensor(np.zeros(3, np.float32), device="nosuch.0")


def test_the_cli_lists_plugins_and_their_failures(tmp_path):
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"the test plugin's device is the LLVM CPU device: {registry.unavailable()}")
    write_plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-m", "tile", "devices"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "plug_cpu.0" in out.stdout and "a plugin's CPU device" in out.stdout
    assert "plug_raises" in out.stdout and "unavailable: entry point 'plug_raises" in out.stdout
    src = tmp_path / "mm.tile"
    src.write_text(MATMUL)
    run = [sys.executable, "-m", "tile", "run", str(src), "--shape", "A=2x3", "--shape", "B=3x4"]
    ran = subprocess.run(
        [*run, "--target", "plug_cpu.0"], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert "C: float32[2, 4]" in ran.stdout
    bad = subprocess.run([*run, "--target", "nosuch.0"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert "device error: no device 'nosuch.0'" in bad.stderr and "plug_cpu.0" in bad.stderr
    assert "Traceback" not in bad.stderr
