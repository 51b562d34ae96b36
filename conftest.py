"""Options for the whole test run (``tests/`` and ``conformance/``).

``--long`` also runs the tests marked ``long``: each takes minutes on a 2-core machine (child
conformance runs over every family, the seeded defects beyond CI's share), so the README's test
command, which CI runs from a fresh clone within its time budget, skips them with the reason.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="also run the tests marked long (minutes each on 2 cores)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "long(why): minutes on 2 cores; run only with --long")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--long"):
        return
    for item in items:
        mark = item.get_closest_marker("long")
        if mark is not None:
            why = mark.args[0] if mark.args else "minutes on 2 cores"
            item.add_marker(pytest.mark.skip(reason=f"long test ({why}): run with --long"))
