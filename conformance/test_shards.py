"""``--conformance-shard=I/N`` adds up, for every family: the shards of a run together compare, find
invalid and find unsupported exactly the examples one unsharded run does (the same examples: their
fingerprints XOR to the unsharded one), and each shard draws them all.

The runs are child pytests, as a backend team's CI runs them, on ``narrow_cpu.0``: the LLVM CPU
device (``llvm_cpu.0``'s compiler and executor) declaring no float16 and no bfloat16, so that some
examples are unsupported besides those the interpreter refuses.
"""

from __future__ import annotations

import inspect

import pytest

from backends import registry
from conformance import test_conformance
from conformance.test_options import rows, suite

FAMILIES = sorted(
    name.removeprefix("test_")
    for name, f in vars(test_conformance).items()
    if name.startswith("test_") and "device" in inspect.signature(f).parameters
)
SHARDS = 2
EXAMPLES = 8

NARROW = """
import copy

from backends import registry
from backends.hal import Capabilities
from tile.dtypes import DType


def pytest_configure(config):
    narrow = copy.copy(registry.get("llvm_cpu.0"))
    narrow.id = "narrow_cpu.0"
    narrow.capabilities = Capabilities(frozenset(DType) - {DType.FLOAT16, DType.BFLOAT16}, fp64=True)
    registry.devices()["narrow_cpu.0"] = narrow
"""

COUNTS = ("examples", "invalid", "unsupported")


LONG = ("optimized",)  # a family whose examples take seconds each: its shards are checked with --long


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> list[dict]:
    """The rows of the unsharded run, then of each shard's (once for all the families' tests)."""
    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"narrow_cpu.0 wraps llvm_cpu.0: {registry.unavailable()}")
    tmp = tmp_path_factory.mktemp("shards")
    args = ("--target", "narrow_cpu.0", f"--conformance-examples={EXAMPLES}")
    if not request.config.getoption("--long"):
        args += ("-k", " and ".join(f"not test_{f}" for f in LONG))
    shards = [(f"--conformance-shard={i}/{SHARDS}",) for i in range(SHARDS)]
    done = [suite(tmp, *args, *extra, plugin=NARROW) for extra in [(), *shards]]
    for status, out, data in done:
        assert status == 0 and data is not None, out
    return [rows(data) for _, _, data in done]


def drawn(row: dict) -> int:
    return sum(row[k] for k in COUNTS) + row["other_shard"]


@pytest.mark.parametrize(
    "family",
    [f if f not in LONG else pytest.param(f, marks=pytest.mark.long("its examples take seconds each"))
     for f in FAMILIES],
)
def test_shards_add_up(runs, family):
    whole, *parts = (r.get((family, "narrow_cpu.0")) for r in runs)
    if whole is None:  # the family skipped on this device: so must every shard
        assert all(p is None for p in parts)
        return
    assert whole["other_shard"] == 0 and whole["examples"] > 0
    for part in parts:
        assert drawn(part) == drawn(whole), (part, whole)  # every shard draws every example
    for k in COUNTS:
        assert sum(p[k] for p in parts) == whole[k], (k, parts, whole)
    fingerprint = 0
    for part in parts:
        fingerprint ^= int(part["fingerprint"], 16)
    assert f"{fingerprint:016x}" == whole["fingerprint"]  # the same examples, not just as many


def test_the_runs_had_invalid_unsupported_and_other_shard_examples(request, runs):
    """What ``test_shards_add_up`` checks is not vacuous: each kind of example occurs."""
    whole, *parts = runs
    skipped = () if request.config.getoption("--long") else LONG
    assert set(f for f, _ in whole) == set(FAMILIES) - set(skipped)
    assert sum(r["invalid"] for r in whole.values()) > 0
    assert sum(r["unsupported"] for r in whole.values()) > 0
    for part in parts:
        assert sum(r["other_shard"] for r in part.values()) > 0
