"""The options a backend team's CI uses: ``--config``, ``--conformance-shard``, ``--conformance-json``,
and expected differences that a device declares (``known_difference``).

Each test runs the suite in a child pytest, as a user's CI would, on a few examples of one or two
families of ``llvm_cpu.0``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backends import registry
from conformance.targets import Param, Shard, example_digest, params
from stripe.config import load_config

ROOT = Path(__file__).resolve().parent.parent

needs_llvm = pytest.mark.skipif(
    "llvm_cpu.0" not in registry.devices(), reason=f"llvm_cpu.0 unavailable: {registry.unavailable()}"
)


def suite(tmp_path: Path, *args: str, plugin: str | None = None) -> tuple[int, str, dict | None]:
    """Run the conformance suite with ``args``; its exit status, output and JSON summary."""
    summary = tmp_path / f"summary-{len(list(tmp_path.glob('summary-*')))}.json"
    cmd = [sys.executable, "-m", "pytest", "conformance/test_conformance.py", "-p", "no:cacheprovider", "-q"]
    cmd += ["--conformance-failures", str(tmp_path / "failures"), "--conformance-json", str(summary), *args]
    env = dict(os.environ)
    if plugin is not None:
        (tmp_path / "suite_plugin.py").write_text(plugin)
        cmd += ["-p", "suite_plugin"]
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    data = json.loads(summary.read_text()) if summary.exists() else None
    return run.returncode, run.stdout + run.stderr, data


def user_config(tmp_path: Path, name: str, device: str | None = "llvm_cpu.0", **change) -> Path:
    data = json.loads((ROOT / "stripe/targets/llvm_cpu.json").read_text())
    data.pop("description")
    data["name"] = name
    if device:
        data["device"] = device
    data.update(change)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def rows(data: dict) -> dict[tuple[str, str], dict]:
    return {(r["family"], r["target"]): r for r in data["rows"]}


def test_params_of_configs(tmp_path):
    mine = load_config(user_config(tmp_path, "mine"))
    alone = load_config(user_config(tmp_path, "alone", device=None))
    assert params(["llvm_cpu.0"], []) == [Param("llvm_cpu.0", "llvm_cpu.0")]
    assert [p.name for p in params([], [mine, alone])] == ["llvm_cpu.0+mine", "stripe:alone"]
    assert [p.name for p in params(["a.0", "b.0"], [alone])] == ["a.0+alone", "b.0+alone"]
    assert params([], [alone])[0].device_id is None


def test_shards_partition_every_example():
    rng = np.random.default_rng(0)
    digests = [example_digest(f"function (X) -> (O) {{ O = X * {k}; }}", {"X": rng.integers(0, 9, 4)})
               for k in range(200)]
    shards = [Shard.parse(f"{i}/3") for i in range(3)]
    owners = [[s.takes(d) for s in shards] for d in digests]
    assert all(sum(o) == 1 for o in owners)
    assert all(any(o[i] for o in owners) for i in range(3))  # no shard is empty on 200 examples
    for bad in ("3/3", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="conformance-shard"):
            Shard.parse(bad)


@needs_llvm
def test_config_runs_the_users_passes_and_the_compiled_families(tmp_path):
    config = user_config(tmp_path, "my_cpu")
    alone = user_config(tmp_path, "nodevice", device=None)
    status, out, data = suite(
        tmp_path, "--config", str(config), "--config", str(alone), "--conformance-examples=3",
        "-k", "optimized or elementwise",
    )
    assert status == 0, out
    got = rows(data)
    assert got[("optimized", "llvm_cpu.0+my_cpu")]["examples"] > 0
    assert got[("elementwise", "llvm_cpu.0+my_cpu")]["examples"] > 0
    assert got[("optimized", "stripe:nodevice")]["examples"] > 0
    assert ("elementwise", "stripe:nodevice") not in got
    assert any(s["target"] == "stripe:nodevice" and "names no device" in s["reason"] for s in data["skipped"])
    assert not any(r["target"].startswith("opencl") for r in data["rows"])  # only the config's device


def test_a_bad_config_is_a_located_usage_error(tmp_path):
    config = user_config(tmp_path, "bad", passes=[{"name": "x", "pass": "no_such_pass"}])
    status, out, _ = suite(tmp_path, "--config", str(config))
    assert status == 4, out  # pytest's usage error, not an internal error
    assert "INTERNALERROR" not in out and "Traceback" not in out
    assert f"{config}:" in out and "config error: passes[0].pass: unknown pass 'no_such_pass'" in out
    assert "^" in out and "hint: the passes are:" in out


def test_an_unknown_device_is_a_usage_error(tmp_path):
    status, out, _ = suite(tmp_path, "--target", "lvm_cpu.0")
    assert status == 4, out  # not "1 skipped": a typo in CI must not pass
    assert "ERROR: --target lvm_cpu.0: no backend knows the device 'lvm_cpu.0'" in out
    assert "the known ones are interp" in out and "Traceback" not in out
    config = user_config(tmp_path, "typo", device="lvm_cpu.0")
    status, out, _ = suite(tmp_path, "--config", str(config))
    assert status == 4, out
    line = next(i for i, t in enumerate(config.read_text().splitlines(), 1) if '"device"' in t)
    assert f"{config}:{line}:" in out
    assert "config error: device: no backend knows the device 'lvm_cpu.0'" in out
    assert "^" in out and "the known ones are interp" in out


def test_a_run_that_compares_no_example_fails(tmp_path):
    status, out, data = suite(tmp_path, "--target", "interp", "-k", "elementwise or contractions")
    assert status == 1, out
    assert "conformance: compared no example on any target, so this run validated nothing" in out
    assert "elementwise on interp: skipped, 'interp' is the reference interpreter itself" in out
    assert data["total"]["examples"] == 0


def test_unit_tests_in_the_folder_are_not_a_conformance_run(tmp_path):
    cmd = [sys.executable, "-m", "pytest", "conformance/test_report.py", "-p", "no:cacheprovider", "-q"]
    cmd += ["-k", "rejects_a_bad_folder or compared_nothing"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr
    assert "compared no example" not in run.stdout


@needs_llvm
def test_json_summary_names_the_failure_folders(tmp_path):
    plugin = (
        "def pytest_configure(config):\n"
        "    from conformance.test_report import register_broken_device\n"
        "    register_broken_device()\n"
    )
    status, out, data = suite(
        tmp_path, "--target", "broken_cpu.0", "-k", "elementwise", "--conformance-examples=5", "--tb=short",
        plugin=plugin,
    )
    assert status == 1, out
    # the user's --tb wins over the suite's one-line report: Hypothesis's own report of the example
    # ("Falsifying example" before Hypothesis 6.16x, "Failing test case" since) is printed
    assert re.search(r"Falsifying example|Failing test case", out), out
    (failure,) = data["failures"]
    assert failure["target"] == "broken_cpu.0" and Path(failure["folder"]).is_dir()
    assert failure["reproduce"].startswith(f"python -m conformance.reproduce {failure['folder']}")
    row = rows(data)[("elementwise", "broken_cpu.0")]
    assert row["failed"] == 1 and row["tests"] == 1 and data["total"]["failed_tests"] == 1
    assert data["total"]["wall_seconds"] > 0 and data["profile"] == "ci"


# A whole-program device that runs the interpreter and then adds one to every float output: a
# "difference" it documents on programs that multiply, and does not on the others.
DIFFERENT = '''
import numpy as np

import ref_interp
from backends import registry
from backends.hal import Capabilities
from backends.program import ProgramDevice
from tile.dtypes import DType


class Different(ProgramDevice):
    id = "different.0"
    description = "the interpreter, one off (a test fixture)"
    capabilities = Capabilities(frozenset({DType.FLOAT32}), fp64=False)
    stage = "tile"

    def execute(self, program, inputs, outputs):
        got = ref_interp.run(program, dict(inputs))
        return {k: (v + 1).astype(v.dtype) for k, v in got.items()}

    def known_difference(self, source, problem):
        # "some": programs with a product, but not the sweeps (conformance.sweeps), which have them all
        some = "*" in source and "O1 =" not in source
        return "semantics §0: this device adds one" if MODE == "all" or some else None


MODE = "{mode}"


def pytest_configure(config):
    registry.devices()["different.0"] = Different()
'''


@needs_llvm
def test_declared_differences_are_expected_failures_with_their_reason(tmp_path):
    args = ("--target", "different.0", "-k", "elementwise", "--conformance-examples=5")
    status, out, data = suite(tmp_path, *args, plugin=DIFFERENT.replace("{mode}", "all"))
    assert status == 0, out
    assert "1 xfailed" in out
    row = rows(data)[("elementwise", "different.0")]
    assert row["expected"] > 0 and row["failed"] == 0
    assert data["expected"][0]["reason"] == "semantics §0: this device adds one"
    assert "expected difference on different.0" in out
    other = tmp_path / "undeclared"
    other.mkdir()
    status, out, data = suite(other, *args, plugin=DIFFERENT.replace("{mode}", "some"))
    assert status == 1, out  # an undeclared difference still fails
    assert rows(data)[("elementwise", "different.0")]["failed"] == 1


@needs_llvm
def test_every_config_is_checked_under_the_first_target_only():
    """The optimized family's pass checks do not depend on the target: the run's first device
    checks every built-in config, the others only their own (optimizer and tiled optimizer)."""
    from conformance.targets import Subject

    first, second = params(["llvm_cpu.0", "llvm_cpu.0"], [])
    assert first.every_config and not second.every_config
    dev = registry.get("llvm_cpu.0")
    assert Subject(first.name, dev, None, {}, first.every_config).pass_configs() is None  # every one
    own = Subject(second.name, dev, None, {}, second.every_config).pass_configs()
    names = {dev.optimizer, getattr(dev, "tiled_optimizer", "")} - {""}
    assert {c.name for c in own} == names | {f"{n}-small" for n in names}
