"""The failure machinery, driven by a deliberately broken device registered only here.

``BrokenDevice`` wraps the LLVM CPU device; after each kernel it adds 1 to the first element of
every buffer the kernel touched, so its outputs are wrong by a known amount. It is registered in
``backends.registry`` the way a new backend would be, and the unchanged conformance suite must
catch it, write the shrunk example and print a command that reproduces the mismatch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from backends import registry
from backends.hal import Buffer, Device, Event, Executor, Kernel, Library
from conformance import report, reproduce
from conformance.strategies import Case

ROOT = Path(__file__).resolve().parent.parent
BROKEN = "broken_cpu.0"


class BrokenKernel(Kernel):
    def __init__(self, inner: Kernel, fail: bool):
        self.inner, self.info, self.fail = inner, inner.info, fail

    def run(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        if self.fail:
            raise RuntimeError("broken_cpu: the kernel crashed")
        done = self.inner.run(params, deps).wait()
        for buf, dtype in zip(params, self.info.buffer_dtypes):
            values = buf.data[: buf.size].view(dtype.numpy)
            if values.size:
                values[0] = ~values[0] if dtype.numpy == np.bool_ else values[0] + 1
        return Event.done(done.duration)


class BrokenExecutor(Executor):
    def __init__(self, inner: Executor, fail: bool):
        self.inner, self.fail = inner, fail

    def allocate(self, size: int) -> Buffer:
        return self.inner.allocate(size)

    def copy(self, src, src_offset, dst, dst_offset, length, deps=()) -> Event:
        return self.inner.copy(src, src_offset, dst, dst_offset, length, deps)

    def prepare(self, library: Library, index: int) -> Kernel:
        return BrokenKernel(self.inner.prepare(library, index), self.fail)


class BrokenDevice(Device):
    def __init__(self, id: str = BROKEN, fail: bool = False):
        llvm = registry.get("llvm_cpu.0")
        self.id = id
        self.description = "the LLVM CPU device with its results perturbed (a test fixture)"
        self.capabilities = llvm.capabilities
        self.compiler = llvm.compiler
        self.executor = BrokenExecutor(llvm.executor, fail)


def register_broken_device() -> None:
    """Entry point for a ``-p`` plugin: make ``broken_cpu.0`` a registered target."""
    registry.devices()[BROKEN] = BrokenDevice()


@pytest.fixture
def broken(monkeypatch, tmp_path):
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"the broken device wraps llvm_cpu.0: {registry.unavailable()}")
    monkeypatch.setitem(registry.devices(), BROKEN, BrokenDevice())
    monkeypatch.setitem(registry.devices(), "crashing_cpu.0", BrokenDevice("crashing_cpu.0", fail=True))
    monkeypatch.setattr(report, "FAILURES", tmp_path / "failures")
    monkeypatch.setattr(report, "STATS", report.Stats())
    return tmp_path / "failures"


def _case() -> Case:
    x = np.array([[1, -2, 3], [4, 5, -6]], np.int32)
    y = np.array([10, 20, 30], np.int32)
    return Case("elementwise", "function (X, Y) -> (O) { O = X + Y; }", {"X": x, "Y": y})


def test_failure_is_written_and_reproduced(broken, capsys):
    from conformance.test_conformance import check

    case = _case()
    with pytest.raises(AssertionError) as err:
        check(case, registry.get(BROKEN))
    (folder,) = broken.iterdir()
    assert re.fullmatch(r"elementwise-broken_cpu\.0-[0-9a-f]{10}", folder.name)
    shown = report._display(folder)  # absolute here: tmp_path is outside the working directory
    message = str(err.value)
    assert message.endswith(f"python -m conformance.reproduce {shown} --target {BROKEN}")
    assert "O: 1 of 6 elements differ: O[0, 0]: expected 11, got 12\n" in message
    assert {p.name for p in folder.iterdir()} == {
        "case.tile",
        "inputs.npz",
        "expected.npz",
        "got.npz",
        "case.json",
    }
    text = (folder / "case.tile").read_text()
    assert text.splitlines()[-1] == case.source
    assert f"// reproduce: python -m conformance.reproduce {shown} --target {BROKEN}" in text
    with np.load(folder / "inputs.npz") as z:
        assert z["X"].dtype == np.int32 and np.array_equal(z["X"], case.inputs["X"])
    with np.load(folder / "expected.npz") as z:
        assert np.array_equal(z["O"], case.inputs["X"] + case.inputs["Y"])
    with np.load(folder / "got.npz") as z:
        want = case.inputs["X"] + case.inputs["Y"]
        assert z["O"][0, 0] == 12 and np.array_equal(z["O"].reshape(-1)[1:], want.reshape(-1)[1:])
    assert json.loads((folder / "case.json").read_text())["tolerance"]["exact"] is True

    capsys.readouterr()
    assert reproduce.main([shown, "--target", BROKEN]) == 1  # the recorded target by default too
    assert "broken_cpu.0 differs from expected.npz: O: 1 of 6 elements differ" in capsys.readouterr().out
    assert reproduce.main([shown]) == 1
    assert reproduce.main([shown, "--target", "llvm_cpu.0", "--save", str(broken.parent / "got.npz")]) == 0
    assert "llvm_cpu.0 matches expected.npz" in capsys.readouterr().out
    with np.load(broken.parent / "got.npz") as z:
        assert np.array_equal(z["O"], case.inputs["X"] + case.inputs["Y"])


def test_correct_device_writes_nothing(broken):
    from conformance.test_conformance import check

    check(_case(), registry.get("llvm_cpu.0"))
    assert not broken.exists()
    assert report.STATS.row(("elementwise", "llvm_cpu.0")).examples == 1


def test_crashing_device_is_a_failure(broken, capsys):
    from conformance.test_conformance import check

    with pytest.raises(
        AssertionError, match="crashing_cpu.0 raised RuntimeError: broken_cpu: the kernel crashed"
    ):
        check(_case(), registry.get("crashing_cpu.0"))
    (folder,) = broken.iterdir()
    assert not (folder / "got.npz").exists() and (folder / "expected.npz").exists()
    assert reproduce.main([str(folder)]) == 1
    assert "crashing_cpu.0 raised RuntimeError" in capsys.readouterr().out


@pytest.mark.parametrize("device", [BROKEN, "llvm_cpu.0"])
def test_a_replayed_example_is_counted_once(broken, device):
    """Hypothesis replays a failing example (while shrinking, and to report it): it is one example."""
    from conformance.targets import example_digest
    from conformance.test_conformance import check

    case = _case()
    for _ in range(3):
        try:
            check(case, registry.get(device))
        except AssertionError:
            assert device == BROKEN
    row = report.STATS.row(("elementwise", device))
    assert row.examples == 1
    assert row.fingerprint == int(example_digest(case.source, case.inputs)[:16], 16)


def test_compared_nothing_only_where_families_ran_and_compared_none():
    stats = report.Stats()
    assert stats.compared_nothing() is None  # no conformance family ran (unit tests only)
    stats.skipped.append(("elementwise", "<none>", "no compiled device is available: none registered"))
    assert stats.compared_nothing() is None  # nothing asked for and nothing here: skipped, not failed
    stats.skipped.append(("gradients", "my.0", "my.0 has no float64"))
    why = stats.compared_nothing()
    assert why.startswith("conformance: compared no example") and "gradients on my.0: skipped" in why
    stats.unsupported_example(("elementwise", "my.0"), "float16 unsupported")
    assert "my.0: 1 example(s) not run, float16 unsupported" in stats.compared_nothing()
    stats.example(("elementwise", "my.0"))
    assert stats.compared_nothing() is None


def test_reproduce_rejects_a_bad_folder(tmp_path, capsys):
    assert reproduce.main([str(tmp_path)]) == 2
    assert "is not a conformance failure folder" in capsys.readouterr().err


def test_prune_keeps_only_the_reported_example(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "FAILURES", tmp_path)
    stats = report.Stats()
    monkeypatch.setattr(report, "STATS", stats)
    case = _case()
    shrunk = Case("elementwise", "function (X) -> (O) { O = -X; }", {"X": np.zeros(1, np.int32)})
    tol = report.Tolerance()
    first = report.write_failure(case, BROKEN, {"O": case.inputs["X"]}, None, "p", tol)
    last = report.write_failure(shrunk, BROKEN, {"O": shrunk.inputs["X"]}, None, "p", tol)
    stats.finish_test(("elementwise", BROKEN), True, 1.5, f"... written to {last}/ ...")
    assert not Path(first).exists() and Path(last).exists()
    assert stats.failures == [(last, BROKEN)]
    merged = report.Stats()
    merged.merge(stats.to_json())
    merged.merge(stats.to_json())
    assert merged.row(("elementwise", BROKEN)).failed == 2 and merged.failures == [(last, BROKEN)] * 2


def test_session_catches_a_newly_registered_backend(tmp_path):
    """The suite, unchanged, on a backend registered by a plugin: the shrunk example is written,
    the message names it and the summary (merged across xdist workers) counts the failure."""
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"the broken device wraps llvm_cpu.0: {registry.unavailable()}")
    (tmp_path / "broken_plugin.py").write_text(
        "def pytest_configure(config):\n"
        "    from conformance.test_report import register_broken_device\n"
        "    register_broken_device()\n"
    )
    failures = tmp_path / "failures"
    args = ["-p", "broken_plugin", "--target", BROKEN, "--target", "llvm_cpu.0", "-k", "elementwise"]
    args += ["--conformance-failures", str(failures), "-p", "no:cacheprovider", "-q"]
    try:
        import xdist  # noqa: F401

        args += ["-n", "2"]
    except ImportError:
        pass
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    cmd = [sys.executable, "-m", "pytest", "conformance/test_conformance.py", *args]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    (folder,) = failures.iterdir()  # only the shrunk example is left
    assert folder.name.startswith("elementwise-broken_cpu.0-")
    shown = str(folder)
    assert f"python -m conformance.reproduce {shown} --target {BROKEN}" in out
    assert re.search(r"elementwise\s+broken_cpu\.0\s+1\s+[1-9]\d*\s+\d+\s+0\s+1\s", out), out
    assert re.search(r"elementwise\s+llvm_cpu\.0\s+1\s+[1-9]\d*\s+\d+\s+0\s+0\s", out), out
    assert f"failing example: {shown}" in out
    # one line per failing example and the command, not Hypothesis's report and a traceback (no --tb)
    command = re.escape(f"python -m conformance.reproduce {shown} ")
    assert re.search(rf"\n[^\n]* elements? differ[^\n]*\n    reproduce: {command}", out), out
    hypothesis_report = r"Falsifying example|Failing test case"  # (its heading before / since 6.16x)
    assert not re.search(hypothesis_report, out) and "def test_elementwise" not in out, out
    stopped = r"elementwise on broken_cpu\.0 stopped at its first failing example: Hypothesis drew \d+"
    assert re.search(stopped, out), out
    program = (folder / "case.tile").read_text().splitlines()[-1]
    assert program.startswith("function") and program.count(";") == 1, program  # shrunk to one statement
    registry.devices()[BROKEN] = BrokenDevice()
    try:
        assert reproduce.main([str(folder)]) == 1
    finally:
        del registry.devices()[BROKEN]


@pytest.mark.filterwarnings("ignore:Using `assume` outside")  # check() is called here without @given
def test_capabilities_skip_with_the_reason(broken):
    from hypothesis.errors import UnsatisfiedAssumption

    from backends.hal import Capabilities
    from conformance.test_conformance import check, needs
    from tile.dtypes import DType

    dev = BrokenDevice("nofp64_cpu.0")
    dev.capabilities = Capabilities(frozenset(DType) - {DType.FLOAT64}, fp64=False)
    with pytest.raises(pytest.skip.Exception, match="nofp64_cpu.0 has no float64: gradient programs"):
        needs(dev, DType.FLOAT64, "gradient programs are checked in float64")
    needs(dev, DType.FLOAT32, "never skipped")
    case = Case("elementwise", "function (X) -> (O) { O = X * 2; }", {"X": np.ones(2)})
    with pytest.raises(UnsatisfiedAssumption):
        check(case, dev)
    assert report.STATS.row(("elementwise", "nofp64_cpu.0")).unsupported == 1
    assert report.STATS.unsupported == {("nofp64_cpu.0", "float64 unsupported"): 1}
    assert not broken.exists()


DOUBLE_WRITE = "function (A[N]) -> (O) { O[i: 2] = =(A[i + j]), j < 2; }"


# ``check`` is called directly here, not from a property: its ``assume`` (refused alike) still raises
@pytest.mark.filterwarnings("ignore:Using `assume` outside a property-based test")
def test_a_program_the_interpreter_refuses_must_be_refused_alike(broken, capsys):
    from hypothesis.errors import UnsatisfiedAssumption

    import tile.tuples
    from conformance.test_conformance import check

    case = Case("contraction", DOUBLE_WRITE, {"A": np.arange(4, dtype=np.float32)})
    with pytest.raises(UnsatisfiedAssumption):  # refused alike: not an example, not a failure
        check(case, registry.get("llvm_cpu.0"))
    assert not broken.exists()
    # a target that answers instead (as compiled programs did before they checked `=`) fails
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tile.tuples, "check_assignments", lambda bound: None)
        with pytest.raises(AssertionError) as err:
            check(case, registry.get("llvm_cpu.0"))
        (folder,) = broken.iterdir()
        capsys.readouterr()
        assert reproduce.main([str(folder)]) == 1
        assert "llvm_cpu.0 answered where the interpreter refuses it" in capsys.readouterr().out
    message = str(err.value)
    assert "the interpreter refuses it with TileRuntimeError: `=` writes O[0] more than once" in message
    assert "but llvm_cpu.0 answered" in message
    meta = json.loads((folder / "case.json").read_text())
    assert meta["refusal"].startswith("TileRuntimeError: `=` writes O[0] more than once")
    assert reproduce.main([str(folder)]) == 0  # with the check in place it refuses alike
    assert "refuses it with the interpreter's error" in capsys.readouterr().out
