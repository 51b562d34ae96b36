"""Conformance options: ``--target=ID`` (repeatable; ``all`` for every device; a plugin's id or
``external:COMMAND`` too), ``--config=F.json`` (repeatable: a user's target config), the
``--conformance-profile=ci|thorough``, ``--conformance-examples=N`` (overrides the profile's
count), ``--conformance-no-shrink`` (a failing example is reported as drawn),
``--conformance-failures=DIR``, ``--conformance-shard=I/N`` (this run checks one of N shares of
the examples: ``conformance.targets``), ``--conformance-ops=OP,...`` (only examples using
these operations: ``conformance.coverage.focus``), ``--conformance-distinguish=K`` (distinguishing
examples sought per operation for the coverage line), ``--conformance-json=F`` (the summary as
JSON, besides pytest's own ``--junitxml``) and ``--precision=native|tf32|3xtf32`` (compile with
that precision setting and compare with the interpreter in that mode, within tolerances derived
from the mode's unit roundoff: ``conformance.precision``). ``--onnx`` adds ONNX's node tests, run
through ``tile.onnx`` on each target and the interpreter (``conformance/onnx_nodes.py``).

Without ``--target`` every available compiled device is checked (none: the tests skip with the
reason). Targets come from ``backends.registry``, so a new backend is validated as soon as it
registers. With ``--config``, the ``optimized`` family checks every pass of that config (and of
its small-memory variant) with the Stripe interpreter, and the compiled families run on the
``--target`` devices (else the device the config names) compiled with that config; a config
error is a usage error that points into the file. A device's ``known_difference`` turns a
difference it documents into an expected one: the example is counted as such, and a test whose
only differences were expected is reported as xfailed with the reasons.

At the end of the session a summary gives, per family and target, the examples
compared, those not run (and why), failing tests and seconds; under pytest-xdist (``-n auto``)
the workers' counts are merged on the controller. Failing examples are written as described in
``conformance/report.py``, and reported (unless ``--tb`` is given) as one line and the command
that reruns them.

No silent green: a ``--target`` or config ``"device"`` no backend knows is a usage error, and a
session that ran the families but compared no example fails (``Stats.compared_nothing``).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from conformance import precision as modes
from conformance import report as reporting  # (pytest names a hook argument `report`)
from conformance import targets as subjects
from tile.errors import TileBackendError, TileDeviceError, TileError

PROFILES = {
    # CI: derandomized and small, so the default test run stays well under its time budget (a
    # fresh clone on 2 cores, cold kernel caches, took 14.5 min in all at 60 examples: PoCL's
    # compiles were 294 s of the 339 s of conformance).
    "ci": dict(
        max_examples=40,
        derandomize=True,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    ),
    # By hand: many thousands of examples across the families.
    "thorough": dict(
        max_examples=3000,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    ),
}
for _name, _kw in PROFILES.items():
    settings.register_profile(f"conformance-{_name}", **_kw)


def pytest_addoption(parser):
    group = parser.getgroup("conformance")
    group.addoption(
        "--target",
        action="append",
        default=[],
        metavar="ID",
        help="a device id from `python -m tile devices` (repeatable; 'all' for every device)",
    )
    group.addoption(
        "--conformance-profile",
        choices=sorted(PROFILES),
        default="ci",
        help="Hypothesis profile for the conformance suite (default: ci)",
    )
    group.addoption(
        "--conformance-examples",
        type=int,
        metavar="N",
        help="examples per family and target, overriding the profile's count",
    )
    group.addoption(
        "--conformance-no-shrink",
        action="store_true",
        help="report a failing example as drawn, without shrinking it (faster, for a verdict alone)",
    )
    group.addoption(
        "--conformance-failures",
        metavar="DIR",
        help="where failing examples are written (default: conformance/failures)",
    )
    group.addoption(
        "--config",
        action="append",
        default=[],
        metavar="F.json",
        help="validate this target config (repeatable): its passes through the Stripe interpreter, "
        "and the compiled families on --target (or the device the config names) with it",
    )
    group.addoption(
        "--conformance-shard",
        metavar="I/N",
        help="check only shard I (0-based) of N: the N shards together check what one run does",
    )
    group.addoption(
        "--generic",
        action="store_true",
        help="compile with settings={'generic': True} on every target: kernels seen before at other sizes "
        "run as shape-generic kernels (backends.llvm.generic on llvm_cpu.0, backends.clike.generic on "
        "OpenCL and CUDA); the summary says how many were generated and bound",
    )
    group.addoption(
        "--precision",
        choices=modes.MODES,
        default="native",
        help="compile with settings={'precision': MODE} and compare with ref_interp in that mode",
    )
    group.addoption(
        "--conformance-ops",
        metavar="OP,...",
        help="narrow the run to examples using these operations (tile.capabilities names: max, cmp_lt, "
        "agg_max, comb_mul, as_int, ...): others are steered to one where an exact neighbour allows, "
        "else left out",
    )
    group.addoption(
        "--conformance-distinguish",
        type=int,
        default=3,
        metavar="K",
        help="distinguishing examples to find per operation and target for the coverage line "
        "(mutating the program and rerunning the interpreter; 0: none; default 3)",
    )
    group.addoption(
        "--onnx",
        action="store_true",
        help="also run ONNX's node tests (onnx.backend.test) through tile.onnx on each --target, the "
        "interpreter included (conformance/onnx_nodes.py); needs the onnx package",
    )
    group.addoption(
        "--conformance-json",
        metavar="F",
        help="also write the summary (examples, failures, seconds per family and target) as JSON",
    )


def _targets(config) -> list[str]:
    from backends import registry

    asked = config.getoption("--target")
    if not asked and config.getoption("--config"):
        return []  # each config's own device
    found: list[str] = []
    for t in asked or ["all"]:
        found.extend(registry.devices() if t == "all" else [t])
    return list(dict.fromkeys(found)) or [subjects.NO_DEVICE]


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        params = subjects.params(_targets(metafunc.config), _USER_CONFIGS)
        metafunc.parametrize("target", params, ids=[p.name for p in params])


_CONFIG: list = []  # the session's config, for the hooks that are not given it
_USER_CONFIGS: list = []  # the loaded --config files
_STARTED: list[float] = []


def _load_user_configs(config) -> None:
    from stripe.config import resolve_config

    loaded = []
    for path in config.getoption("--config"):
        try:
            loaded.append(resolve_config(path))
        except TileError as e:  # a located ConfigError: shown as it is, not as an internal error
            raise pytest.UsageError(f"--config {path}:\n{e}") from None
    _USER_CONFIGS[:] = loaded


@pytest.fixture(autouse=True)
def _poisoned_buffers(monkeypatch):
    """Every conformance test runs with ``TILE_POISON_BUFFERS=1`` (``backends.runner.allocate``):
    a target's new output and temporary buffers start as 0xFF bytes, so an element its kernels
    never write fails the comparison even where the memory held the right answer from an earlier
    run of the same shapes. Child runs (the seeded defects, the options tests) inherit it."""
    monkeypatch.setenv("TILE_POISON_BUFFERS", "1")


def pytest_configure(config):
    _CONFIG[:] = [config]
    _STARTED[:] = [time.perf_counter()]
    _load_user_configs(config)
    modes.MODE = config.getoption("--precision")
    shard = config.getoption("--conformance-shard")
    if shard:
        try:
            subjects.SHARD = subjects.Shard.parse(shard)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
    _focus(config)
    reporting.STATS.coverage.k = max(0, config.getoption("--conformance-distinguish"))
    profile = f"conformance-{config.getoption('--conformance-profile')}"
    if config.getoption("--conformance-examples"):
        n = config.getoption("--conformance-examples")
        settings.register_profile(f"{profile}-{n}", settings.get_profile(profile), max_examples=n)
        profile = f"{profile}-{n}"
    if config.getoption("--conformance-no-shrink"):
        phases = [p for p in Phase if p != Phase.shrink]
        settings.register_profile(f"{profile}-no-shrink", settings.get_profile(profile), phases=phases)
        profile = f"{profile}-no-shrink"
    settings.load_profile(profile)
    if config.getoption("--conformance-failures"):
        reporting.FAILURES = Path(config.getoption("--conformance-failures")).resolve()


def _focus(config) -> None:
    """``--conformance-ops``: the chosen operations, each one ``tile.capabilities`` names."""
    import difflib

    from tile.capabilities import OPERATIONS

    given = config.getoption("--conformance-ops")
    chosen = frozenset(op.strip() for op in (given or "").split(",") if op.strip())
    for op in sorted(chosen - OPERATIONS):
        close = difflib.get_close_matches(op, sorted(OPERATIONS), 1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise pytest.UsageError(
            f"--conformance-ops: unknown operation '{op}'; {hint}operations are builtins by name (max, "
            "cmp_lt, as_int), aggregations agg_sum|agg_prod|agg_max|agg_min|agg_assign and combinations "
            "comb_mul|comb_add|comb_eq|comb_cond (tile.capabilities.OPERATIONS)"
        )
    if given is not None and not chosen:
        raise pytest.UsageError("--conformance-ops: name at least one operation, e.g. --conformance-ops=max")
    subjects.FOCUS = chosen


def _unknown(device_id: str) -> str | None:
    """Why ``device_id`` names no device any backend knows (None: a device, or one its backend
    says is unavailable here, whose tests skip with that reason)."""
    from backends import registry

    if device_id in registry.ids():  # (the interpreter is no device)
        return None
    try:
        registry.get(device_id)
    except TileDeviceError:
        if any(device_id.startswith(k.split(":")[0]) for k in registry.unavailable()):
            return None
        return (
            f"no backend knows the device '{device_id}'; the known ones are {', '.join(registry.ids())} "
            "(`python -m tile devices` lists them and says why others are unavailable; "
            "'external:COMMAND' runs a backend in another process)"
        )
    return None


@pytest.hookimpl(trylast=True)  # after every plugin's pytest_configure has registered its devices
def pytest_sessionstart(session):
    """A device named on the command line or by a ``--config`` file that no backend knows is a
    usage error (a typo would otherwise validate nothing and pass)."""
    from stripe.config import error_at

    config = session.config
    for t in config.getoption("--target"):
        why = _unknown(t) if t != "all" else None
        if why is not None:
            raise pytest.UsageError(f"--target {t}: {why}")
    if config.getoption("--target"):
        return  # the configs run on these devices, not on the ones they name
    for cfg in _USER_CONFIGS:
        why = _unknown(cfg.device) if cfg.device else None
        if why is not None:
            hint = 'fix "device", or give --target ID to run the config on another device'
            raise pytest.UsageError(f"--config {cfg.source}:\n{error_at(cfg.source, ('device',), why, hint)}")


@pytest.fixture
def device(target, request):
    """The target as a ``conformance.targets.Subject`` (its device, and the user's config if
    any); the test's examples are counted under (family, target name)."""
    from backends import registry

    family = request.node.originalname.removeprefix("test_")
    request.node.user_properties.append(("conformance", [family, target.name]))
    if target.name == subjects.NO_DEVICE:
        pytest.skip(f"no compiled device is available: {registry.unavailable() or 'none registered'}")
    if target.device_id == "interp":
        pytest.skip("'interp' is the reference interpreter itself: there is nothing to compare")
    dev = None
    if target.device_id is not None:
        try:
            dev = registry.get(target.device_id)
            _ = dev.capabilities  # an external backend starts here: a broken one fails the test cleanly
        except TileDeviceError as e:
            pytest.skip(e.message)
        except TileBackendError as e:
            pytest.fail(f"{target.device_id}: {e.message}", pytrace=False)
        from conformance.capabilities import problem

        wrong = problem(getattr(dev.capabilities, "declared", None))
        if wrong is not None:
            pytest.fail(f"{target.device_id}: {wrong}", pytrace=False)
    user = next((c for c in _USER_CONFIGS if c.source == target.config), None)
    settings = {"config": target.config} if target.config and dev is not None else {}
    if modes.MODE != "native":
        settings["precision"] = modes.MODE
    if request.config.getoption("--generic") and dev is not None:
        settings["generic"] = True
        _GENERIC_DEVICES[dev.id] = dev
    reporting.STATS.current = (family, target.name)
    reporting.STATS.test_expected.clear()
    yield subjects.Subject(target.name, dev, user, settings, target.every_config)
    reporting.STATS.current = None


def _tb_given(config) -> bool:
    """Whether the user chose a traceback style (on the command line, PYTEST_ADDOPTS or addopts)."""
    args = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    args += config.getini("addopts")
    return config.option.tbstyle != "auto" or any(str(a).startswith("--tb") for a in args)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A conformance test that passed with expected differences is reported as xfailed, naming
    them (a failure stays a failure). A failing one is reported, unless ``--tb`` is given, as
    ``report.short_failure`` words it: what differs, on one line, and the command that reruns it."""
    outcome = yield
    rep = outcome.get_result()
    conformance = "conformance" in dict(item.user_properties)
    if rep.when == "call" and rep.failed and conformance and call.excinfo and not _tb_given(item.config):
        short = reporting.short_failure(call.excinfo.value)
        if short is not None:
            rep.longrepr = short
    if rep.when == "call" and rep.failed and conformance and subjects.FOCUS and call.excinfo:
        from hypothesis.errors import Unsatisfiable

        if isinstance(call.excinfo.value, Unsatisfiable):  # no drawn example could use the operations
            rep.outcome = "skipped"
            ops = ", ".join(sorted(subjects.FOCUS))
            why = f"Skipped: no example of this family uses or can be steered to {ops}"
            rep.longrepr = (str(item.path), item.location[1] or 0, why)
    if rep.when == "call" and rep.passed and reporting.STATS.test_expected:
        reasons = sorted(set(reporting.STATS.test_expected))
        rep.outcome = "skipped"
        rep.wasxfail = f"{len(reporting.STATS.test_expected)} expected difference(s): " + "; ".join(reasons)


def _is_xdist_controller(config) -> bool:
    """True in the process that only distributes tests (its workers report their own counts)."""
    return config.pluginmanager.has_plugin("dsession")


def pytest_runtest_logreport(report):
    key = dict(report.user_properties).get("conformance")
    if key is None or _is_xdist_controller(_CONFIG[0]):
        return
    if report.skipped:  # a missing device (setup) or a capability the family needs (call)
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reporting.STATS.skipped.append((*key, reason.removeprefix("Skipped: ")))
    elif report.when == "call":
        message = str(report.longrepr) if report.failed else ""
        reporting.STATS.finish_test(tuple(key), report.failed, report.duration, message)


_NOTHING: list[str] = []  # why the run compared no example, for the terminal summary
_GENERIC_DEVICES: dict = {}  # --generic: the devices compiled for, by id
_GENERIC: dict[str, list[int]] = {}  # --generic: device id -> [templates generated, kernels bound to one]


def generic_counts(dev) -> tuple[int, int | None]:
    """How many shape-generic templates ``dev`` generated in this process, and how many kernels it
    bound to one built before (None where the backend does not count them: llvm's)."""
    reg = getattr(getattr(dev, "compiler", None), "generic", None)  # the C-like targets'
    if reg is not None:
        return reg.generated, reg.bound
    if dev.id.startswith("llvm"):
        from backends.llvm.generic_forms import REGISTRY

        return REGISTRY.generated, None
    return 0, None


def _merge_generic(counts: dict) -> None:
    for dev_id, (made, bound) in counts.items():
        got = _GENERIC.setdefault(dev_id, [0, 0])
        got[0] += made
        got[1] += bound or 0


def pytest_sessionfinish(session):
    if session.config.getoption("--generic", False):
        mine = {d: generic_counts(dev) for d, dev in _GENERIC_DEVICES.items()}
        if hasattr(session.config, "workeroutput"):
            session.config.workeroutput["generic"] = mine
        else:
            _merge_generic(mine)
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the counts to the controller
        session.config.workeroutput["conformance"] = reporting.STATS.to_json()
        return
    why = reporting.STATS.compared_nothing()
    if why is not None and session.exitstatus == pytest.ExitCode.OK:
        _NOTHING[:] = [why]
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    data = getattr(node, "workeroutput", {}).get("conformance")
    if data:
        reporting.STATS.merge(data)
    _merge_generic(getattr(node, "workeroutput", {}).get("generic") or {})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    profile = config.getoption("--conformance-profile")
    lines = reporting.STATS.lines(profile)
    if lines:
        terminalreporter.write_sep("=", "conformance: examples per family and target")
        for line in lines:
            terminalreporter.write_line(line)
    if _GENERIC:
        terminalreporter.write_sep("=", "conformance --generic: shape-generic kernels")
        for dev_id, (made, bound) in sorted(_GENERIC.items()):
            terminalreporter.write_line(f"{dev_id}: {made} templates generated, {bound} kernels bound to one "
                                        "built before (llvm_cpu.0 counts no bindings)")
    for why in _NOTHING:
        terminalreporter.write_sep("=", "conformance: FAILED", red=True, bold=True)
        terminalreporter.write_line(why, red=True)
    path = config.getoption("--conformance-json")
    if path and not hasattr(config, "workeroutput"):
        shard = config.getoption("--conformance-shard") or "0/1"
        seconds = time.perf_counter() - _STARTED[0]
        data = reporting.STATS.summary(profile, shard, seconds)
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
        terminalreporter.write_line(f"conformance summary written to {path}")


@pytest.fixture(scope="module")
def peer():
    """PlaidML 0.7 in a child process, for the peer tests (skipped, with the reason, without it)."""
    from conformance import plaidml_peer

    why = plaidml_peer.unavailable()
    if why is not None:
        pytest.skip(why)
    p = plaidml_peer.PlaidML(timeout=60.0)
    yield p
    p.close()
