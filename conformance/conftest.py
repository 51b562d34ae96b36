"""Conformance options: ``--target=ID`` (repeatable; ``all`` for every device) and
``--conformance-profile=ci|thorough``.

Without ``--target`` every available compiled device is checked (none: the suite checks the
interpreter against itself only where that is meaningful, and skips the rest with the reason).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

PROFILES = {
    # CI: derandomized and small, so the default test run stays well under its time budget.
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


def _targets(config) -> list[str]:
    from backends import registry

    asked = config.getoption("--target") or ["all"]
    if "all" in asked:
        return list(registry.devices()) or ["<none>"]
    return asked


def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", _targets(metafunc.config))


def pytest_configure(config):
    settings.load_profile(f"conformance-{config.getoption('--conformance-profile')}")


@pytest.fixture
def device(target):
    from backends import registry

    if target == "<none>":
        pytest.skip(f"no compiled device is available: {registry.unavailable() or 'none registered'}")
    try:
        return registry.get(target)
    except KeyError as e:
        pytest.skip(str(e.args[0]))
