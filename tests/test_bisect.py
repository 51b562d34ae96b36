"""``python -m conformance.bisect``: it names the pass step, or the code generator, that broke a
recorded failure, and refuses unusable input with exit status 2.

A deliberately wrong pass (sums become maxima) is registered here under a test-only name and put
in the middle of the llvm_cpu pipeline by a config file; a test-only HAL device miscompiles (its
compiler hands the LLVM compiler kernels whose constants are off by one), and a test-only
whole-program device answers one element wrong. Inputs are small integers, so every comparison
is exact.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

import ref_interp
from backends import registry
from backends.hal import Compiler, Device
from backends.program import ProgramDevice
from conformance import bisect, report
from conformance.strategies import Case
from stripe.config import target_config
from stripe.ir import Block, Constant
from stripe.passes.registry import PASSES, register

WRONG = "test_bisect_sum_to_max"
SUM = "function (X) -> (O) { O[i: 2] = +(X[i, j]); }"
CHAIN_SUM = "function (X) -> (O) { T = X * 2; U = T - 1; O[i: 2] = +(U[i, j]); }"  # passes change it
PLUS_ONE = "function (X) -> (O) { O = X + 1; }"
X = np.array([[1, -2, 3], [4, 5, -6]], np.int32)


@dataclass(frozen=True)
class NoParams:
    pass


def _sums_to_max(block: Block) -> Block:
    refs = tuple(replace(r, agg_op="max") if r.agg_op == "add" else r for r in block.refs)
    stmts = tuple(_sums_to_max(s) if isinstance(s, Block) else s for s in block.stmts)
    return replace(block, refs=refs, stmts=stmts)


@pytest.fixture
def wrong_pass():
    """The pass ``WRONG``: every ``+`` aggregation becomes ``>`` (registered for this test only)."""
    register(WRONG, NoParams)(lambda program, cfg, hw: _sums_to_max(program))
    yield WRONG
    del PASSES[WRONG]


@pytest.fixture
def failures(monkeypatch, tmp_path):
    monkeypatch.setattr(report, "FAILURES", tmp_path / "failures")
    monkeypatch.setattr(report, "STATS", report.Stats())
    return tmp_path / "failures"


def _folder(failures: Path, source: str, target: str, family: str = "contraction") -> str:
    """A failure folder as the suite writes it, with the interpreter's outputs as expected.npz."""
    case = Case(family, source, {"X": X})
    want = ref_interp.run(source, {"X": X})
    report.write_failure(case, target, want, None, f"recorded against {target}", report.Tolerance())
    (folder,) = failures.iterdir()
    return str(folder)


def _config_file(tmp_path: Path, passes: list[dict], name: str = "with_wrong") -> Path:
    """The llvm_cpu config's hardware and ``passes``, as a file."""
    data = json.loads((Path(target_config("llvm_cpu").source)).read_text())
    data["name"], data["passes"] = name, passes
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def _llvm_passes() -> list[dict]:
    data = json.loads(Path(target_config("llvm_cpu").source).read_text())
    return data["passes"]


def _needs_llvm() -> None:
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"no llvm_cpu.0: {registry.unavailable()}")


def test_names_the_wrong_pass_step(wrong_pass, failures, tmp_path, capsys):
    passes = _llvm_passes()
    middle = len(passes) // 2
    passes.insert(middle, {"name": "sabotage", "pass": wrong_pass, "params": {}})
    config = _config_file(tmp_path, passes)
    folder = _folder(failures, CHAIN_SUM, "llvm_cpu.0")
    assert bisect.main([folder, "--config", str(config), "--target", "stripe:with_wrong@sabotage"]) == 1
    out = capsys.readouterr().out
    total = len(passes)
    assert f"config: with_wrong from {config}, {total} pass steps" in out
    assert "lowered program: ok" in out
    for k, spec in enumerate(passes[:middle], 1):  # every step before it agrees
        assert f"step {k}/{total} {spec['name']} ({spec['pass']}): ok\n" in out
    assert f"step {middle + 1}/{total} sabotage ({wrong_pass}): DIFFERS from the interpreter" in out
    assert "culprit: pass step 'sabotage' of config with_wrong" in out
    assert re.findall(r"culprit: pass step '([^']*)'", out) == ["sabotage"]
    assert f"step {middle + 2}/" not in out  # it stops at the culprit
    # the elements: the sums 1 and 3 of 2 * X - 1 became maxima 5 and 9
    assert "O: 2 of 2 elements differ" in out
    assert "O[0]: expected 1, got 5" in out and "O[1]: expected 3, got 9" in out
    # the diff of the Stripe text before and after the step
    assert "--- before sabotage" in out and "+++ after sabotage" in out
    diff = out[out.index("--- before sabotage") :].splitlines()[2:]
    minus = [line[5:] for line in diff if line.startswith("    -")]
    plus = [line[5:] for line in diff if line.startswith("    +")]
    assert minus and all(":add" in line for line in minus)  # only what this step changed
    assert [line.replace(":max", ":add") for line in plus] == minus


def test_the_device_config_with_a_wrong_pass_on_a_device(wrong_pass, failures, tmp_path, capsys):
    """--config on a device target: the device's own config is replaced, the compiled program is
    never reached because the pass step is found first."""
    _needs_llvm()
    passes = _llvm_passes()
    passes.insert(3, {"name": "sabotage", "pass": wrong_pass, "params": {}})
    config = _config_file(tmp_path, passes)
    folder = _folder(failures, SUM, "llvm_cpu.0")
    assert bisect.main([folder, "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert f"step 4/{len(passes)} sabotage ({wrong_pass}): DIFFERS" in out
    assert "compiled on" not in out


def test_a_pass_that_breaks_verify_is_named(failures, tmp_path, capsys):
    name = "test_bisect_bad_agg"
    register(name, NoParams)(lambda program, cfg, hw: _bad_agg(program))
    try:
        passes = _llvm_passes()[:2] + [{"name": "bad", "pass": name, "params": {}}]
        config = _config_file(tmp_path, passes, "bad_agg")
        folder = _folder(failures, SUM, "stripe:llvm_cpu@fuse_eltwise")
        assert bisect.main([folder, "--config", str(config)]) == 1
    finally:
        del PASSES[name]
    out = capsys.readouterr().out
    assert "step 3/3 bad (test_bisect_bad_agg): its output fails stripe.verify:" in out
    assert "culprit: pass step 'bad'" in out


def test_a_pass_that_raises_is_named(failures, tmp_path, capsys):
    name = "test_bisect_raises"

    def crash(program, cfg, hw):
        raise RuntimeError("the pass crashed")

    register(name, NoParams)(crash)
    try:
        steps = _llvm_passes()
        at = next(k for k, p in enumerate(steps) if p["name"] == "fuse_eltwise")
        passes = steps[at : at + 1] + [{"name": "boom", "pass": name, "params": {}}] + steps[at + 1 : at + 3]
        config = _config_file(tmp_path, passes, "crashing")
        folder = _folder(failures, SUM, "stripe:llvm_cpu@fuse_eltwise")
        assert bisect.main([folder, "--config", str(config)]) == 1
    finally:
        del PASSES[name]
    out = capsys.readouterr().out
    assert "step 1/4 fuse_eltwise (fusion): ok" in out
    assert f"step 2/4 boom ({name}): raised RuntimeError: the pass crashed (at {__file__}:" in out
    assert "in crash)" in out and "culprit: pass step 'boom'" in out and "step 3/4" not in out


def test_the_recorded_user_config_and_its_small_variant(wrong_pass, failures, tmp_path, capsys):
    """A failure of a user's config (``config`` in case.json) on its small variant is bisected with
    that config, shrunk as the suite shrank it."""
    passes = _llvm_passes()
    passes.insert(2, {"name": "sabotage", "pass": wrong_pass, "params": {}})
    config = _config_file(tmp_path, passes, "mine")
    folder = Path(_folder(failures, SUM, "stripe:mine-small@sabotage"))
    meta = json.loads((folder / "case.json").read_text())
    (folder / "case.json").write_text(json.dumps({**meta, "config": str(config)}))
    assert bisect.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"config: mine-small from {config}, {len(passes)} pass steps\n" in out
    assert f"step 3/{len(passes)} sabotage ({wrong_pass}): DIFFERS" in out


def test_a_refusal_folder_is_not_bisected(failures, capsys):
    case = Case("contraction", SUM, {"X": X})
    refusal = "TileTypeError: made up"
    report.write_failure(case, "llvm_cpu.0", {}, None, "answered", report.Tolerance(), refusal)
    (folder,) = failures.iterdir()
    assert bisect.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert "the interpreter refuses the program" in err and "(TileTypeError: made up)" in err
    assert "python -m conformance.reproduce" in err


def _bad_agg(block: Block) -> Block:
    refs = tuple(replace(r, agg_op="sideways") if r.agg_op == "add" else r for r in block.refs)
    return replace(
        block, refs=refs, stmts=tuple(_bad_agg(s) if isinstance(s, Block) else s for s in block.stmts)
    )


class OffByOneCompiler(Compiler):
    """The LLVM compiler, handed kernels whose integer constants are one more than the program's."""

    def __init__(self, inner: Compiler):
        self.inner = inner

    def build(self, kernels, settings):
        return self.inner.build([replace(k, block=_plus_one(k.block)) for k in kernels], settings)


def _plus_one(block: Block) -> Block:
    stmts = []
    for s in block.stmts:
        if isinstance(s, Block):
            s = _plus_one(s)
        elif isinstance(s, Constant) and isinstance(s.value, int):
            s = replace(s, value=s.value + 1)
        stmts.append(s)
    return replace(block, stmts=tuple(stmts))


class MiscompilingDevice(Device):
    def __init__(self, id: str, optimizer: str):
        self.llvm = registry.get("llvm_cpu.0")
        self.id, self.optimizer = id, optimizer
        self.description = "the LLVM CPU device with a miscompiling compiler (a test fixture)"
        self.capabilities = self.llvm.capabilities
        self.compiler = OffByOneCompiler(self.llvm.compiler)
        self.executor = self.llvm.executor

    def hardware(self, hw):
        return self.llvm.hardware(hw)


@pytest.mark.parametrize("optimizer", ["llvm_cpu", ""])
def test_every_pass_agrees_and_the_code_generator_is_named(optimizer, failures, monkeypatch, capsys):
    _needs_llvm()
    dev_id = "miscompiling_cpu.0"
    monkeypatch.setitem(registry._devices, dev_id, MiscompilingDevice(dev_id, optimizer))
    folder = _folder(failures, PLUS_ONE, dev_id, family="elementwise")
    assert bisect.main([folder]) == 1
    out = capsys.readouterr().out
    if optimizer:
        steps = target_config("llvm_cpu").passes
        assert len(re.findall(r"^step \d+/\d+ .*: ok$", out, re.M)) == len(steps)
        assert "every pass step agrees with the interpreter, the compiled program does not" in out
    else:
        assert f"target {dev_id} has no optimizer config" in out and "step 1/" not in out
        assert "the lowering agrees with the interpreter, the compiled program does not" in out
    assert f"compiled on {dev_id}: DIFFERS from the interpreter" in out
    assert f"look at the code generator of {dev_id} (device {__name__}.MiscompilingDevice" in out
    assert f"compiler {__name__}.OffByOneCompiler" in out
    assert "O: 6 of 6 elements differ" in out and "O[0, 0]: expected 2, got 3" in out
    assert "O[1, 2]: expected -5, got -4" in out


class WholeProgramDevice(ProgramDevice):
    """Runs the Tile text with the interpreter, and answers its first element plus ``error``."""

    stage = "tile"

    def __init__(self, error: int):
        self.id = "whole_program.0"
        self.description = "the interpreter as a whole-program device (a test fixture)"
        self.capabilities = registry.get("llvm_cpu.0").capabilities
        self.error = error

    def execute(self, program, inputs, outputs):
        got = ref_interp.run(program, inputs)
        got["O"].reshape(-1)[0] += self.error
        return got


@pytest.mark.parametrize("error", [0, 7])
def test_a_whole_program_device_shows_no_passes(error, failures, monkeypatch, capsys):
    _needs_llvm()
    monkeypatch.setitem(registry._devices, "whole_program.0", WholeProgramDevice(error))
    folder = _folder(failures, PLUS_ONE, "whole_program.0", family="elementwise")
    assert bisect.main([folder]) == (1 if error else 0)
    out = capsys.readouterr().out
    assert "target whole_program.0 is a whole-program device" in out
    assert "its passes are not visible, only its outputs are compared" in out
    assert "lowered program" not in out and "step 1/" not in out
    if error:
        assert "O[0, 0]: expected 2, got 9" in out
        assert f"culprit: whole_program.0 ({__name__}) answers differently from the interpreter" in out
    else:
        assert "the failure no longer reproduces" in out


@pytest.mark.parametrize("target", ["llvm_cpu.0", "stripe:llvm_cpu-small@self_init"])
def test_a_failure_that_no_longer_reproduces(target, failures, capsys):
    if not target.startswith("stripe:"):
        _needs_llvm()
    folder = _folder(failures, SUM, target)
    assert bisect.main([folder]) == 0
    out = capsys.readouterr().out
    assert f"family contraction, recorded on {target}: recorded against {target}" in out
    assert "culprit" not in out and "DIFFERS" not in out
    assert out.rstrip().endswith("nothing differs from the interpreter: the failure no longer reproduces")
    assert ("compiled on llvm_cpu.0: ok" in out) == (target == "llvm_cpu.0")
    if target.startswith("stripe:"):
        assert "config: llvm_cpu-small from" in out


def test_the_recorded_config_of_a_tiled_pipeline_is_used(failures, capsys):
    _needs_llvm()
    case = Case("contraction", SUM, {"X": X})
    problem = "O: 1 of 2 elements differ (with config llvm_cpu_tiled)"
    report.write_failure(case, "llvm_cpu.0", ref_interp.run(SUM, {"X": X}), None, problem, report.Tolerance())
    (folder,) = failures.iterdir()
    assert bisect.main([str(folder)]) == 0
    assert "config: llvm_cpu_tiled from" in capsys.readouterr().out


def test_a_bad_config_is_refused_with_its_location(failures, tmp_path, capsys):
    passes = _llvm_passes()
    passes.insert(1, {"name": "nope", "pass": "no_such_pass", "params": {}})
    config = _config_file(tmp_path, passes, "unknown_pass")
    folder = _folder(failures, SUM, "stripe:llvm_cpu@fuse_eltwise")
    assert bisect.main([folder, "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    line = next(k for k, text in enumerate(config.read_text().splitlines(), 1) if "no_such_pass" in text)
    assert (
        err.startswith(f"{config}:{line}:")
        and "config error: passes[1].pass: unknown pass 'no_such_pass'" in err
    )
    assert "^" in err and "Traceback" not in err


def test_a_folder_that_is_not_a_failure_folder(tmp_path, capsys):
    (tmp_path / "case.tile").write_text(SUM)
    assert bisect.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path} is not a conformance failure folder" in err and "Traceback" not in err


def test_an_unknown_target_names_the_available_ones(failures, capsys):
    folder = _folder(failures, SUM, "llvm_cpu.0")
    assert bisect.main([folder, "--target", "no_such_device.0"]) == 2
    err = capsys.readouterr().err
    assert "no device 'no_such_device.0'" in err and "available: interp" in err
    for dev_id in registry.devices():
        assert dev_id in err


def test_an_unknown_stripe_config_is_refused(failures, capsys):
    folder = _folder(failures, SUM, "llvm_cpu.0")
    assert bisect.main([folder, "--target", "stripe:no_such_config@x"]) == 2
    err = capsys.readouterr().err
    assert "no config 'no_such_config'" in err and "llvm_cpu-small" in err
