"""Conformance options: ``--target=ID`` (repeatable; ``all`` for every device),
``--conformance-profile=ci|thorough``, ``--conformance-examples=N`` (overrides the profile's count)
and ``--conformance-failures=DIR``.

Without ``--target`` every available compiled device is checked (none: the tests skip with the
reason). Targets come from ``backends.registry``, so a new backend is validated as soon as it
registers. At the end of the session a summary gives, per family and target, the examples
compared, those not run (and why), failing tests and seconds; under pytest-xdist (``-n auto``)
the workers' counts are merged on the controller. Failing examples are written as described in
``conformance/report.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from conformance import report as reporting  # (pytest names a hook argument `report`)
from tile.errors import TileDeviceError

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
        "--conformance-failures",
        metavar="DIR",
        help="where failing examples are written (default: conformance/failures)",
    )


def _targets(config) -> list[str]:
    from backends import registry

    asked = config.getoption("--target") or ["all"]
    found: list[str] = []
    for t in asked:
        found.extend(registry.devices() if t == "all" else [t])
    return list(dict.fromkeys(found)) or ["<none>"]


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", _targets(metafunc.config))


_CONFIG: list = []  # the session's config, for the hooks that are not given it


def pytest_configure(config):
    _CONFIG[:] = [config]
    profile = f"conformance-{config.getoption('--conformance-profile')}"
    if config.getoption("--conformance-examples"):
        n = config.getoption("--conformance-examples")
        settings.register_profile(f"{profile}-{n}", settings.get_profile(profile), max_examples=n)
        profile = f"{profile}-{n}"
    settings.load_profile(profile)
    if config.getoption("--conformance-failures"):
        reporting.FAILURES = Path(config.getoption("--conformance-failures")).resolve()


@pytest.fixture
def device(target, request):
    """The target's ``Device``; the test's examples are counted under (family, target)."""
    from backends import registry

    family = request.node.originalname.removeprefix("test_")
    request.node.user_properties.append(("conformance", [family, target]))
    if target == "<none>":
        pytest.skip(f"no compiled device is available: {registry.unavailable() or 'none registered'}")
    if target == "interp":
        pytest.skip("'interp' is the reference interpreter itself: there is nothing to compare")
    try:
        dev = registry.get(target)
    except TileDeviceError as e:
        pytest.skip(e.message)
    reporting.STATS.current = (family, target)
    yield dev
    reporting.STATS.current = None


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


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the counts to the controller
        session.config.workeroutput["conformance"] = reporting.STATS.to_json()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    data = getattr(node, "workeroutput", {}).get("conformance")
    if data:
        reporting.STATS.merge(data)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = reporting.STATS.lines(config.getoption("--conformance-profile"))
    if lines:
        terminalreporter.write_sep("=", "conformance: examples per family and target")
        for line in lines:
            terminalreporter.write_line(line)


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
