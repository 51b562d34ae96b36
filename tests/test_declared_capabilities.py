"""A target's declaration (``tile.capabilities.Declared``) through each way in: the value itself,
a config's ``"capabilities"`` section (located errors), and the external protocol's handshake
(version 2 carries it, version 1 is still accepted and declares nothing)."""

from __future__ import annotations

import json

import pytest

from backends.external.server import hello
from backends.hal import Capabilities
from stripe.config import ConfigError, format_config, parse_config
from tests.test_external_handshake import device  # a backend that only greets
from tile.capabilities import OPERATIONS, Declared
from tile.dtypes import DType
from tile.errors import TileBackendError

V1 = {"protocol": "tile-external", "version": 1, "name": "old", "stage": "tile", "dtypes": ["int32"]}


def test_a_declaration_is_a_value():
    a = Declared(operations={"max", "add"}, dtypes=[DType.FLOAT32, "int32"], max_rank=3)
    assert a == Declared(operations=("add", "max"), dtypes=("float32", "int32"), max_rank=3)
    assert a.invalid() is None and a.allows_operation("max") and not a.allows_operation("min")
    assert a.allows_dtype(DType.INT32) and not a.allows_dtype(DType.FLOAT16)
    assert Declared().allows_operation("gather") and Declared().allows_dtype(DType.BFLOAT16)
    both = a.restrict(Declared(operations=("max", "min"), max_rank=2, tolerance="exact"))
    assert both == Declared(operations=("max",), dtypes=("float32", "int32"), max_rank=2, tolerance="exact")
    assert Declared.from_json(a.to_json()) == a
    assert {"agg_max", "comb_cond", "max", "as_int", "gather"} <= OPERATIONS


@pytest.mark.parametrize(
    "bad, words",
    [
        (Declared(operations=("maxx",)), ["operations", "unknown operation 'maxx'", "did you mean 'max'"]),
        (Declared(dtypes=("float31",)), ["dtypes", "unknown dtype 'float31'"]),
        (Declared(stages=("lowered",)), ["stages", "unknown stage 'lowered'"]),
        (Declared(max_rank=0), ["max_rank", "not a positive integer"]),
        (Declared(tolerance="loose"), ["tolerance", "unknown tolerance class 'loose'"]),
    ],
)
def test_a_bad_declaration_says_what(bad, words):
    text = " ".join(bad.invalid())
    assert all(w in text for w in words), text


CONFIG = {"extends": "llvm_cpu", "name": "mine", "device": "llvm_cpu.0"}


def test_a_config_declares_and_writes_it_back():
    caps = {"operations": ["add", "agg_sum"], "dtypes": ["int32"], "max_elements": 64, "tolerance": "relaxed"}
    cfg = parse_config(json.dumps({**CONFIG, "capabilities": caps}), "mine.json")
    assert cfg.capabilities == Declared(("add", "agg_sum"), ("int32",), None, None, 64, "relaxed")
    again = parse_config(format_config(cfg), "mine.json")
    assert again.capabilities == cfg.capabilities
    assert parse_config(json.dumps(CONFIG), "mine.json").capabilities is None


@pytest.mark.parametrize(
    "caps, where, words",
    [
        ({"operations": ["add", "cmp_lf"]}, "capabilities.operations", "unknown operation 'cmp_lf'"),
        ({"max_rank": -1}, "capabilities.max_rank", "not a positive integer"),
        ({"max_rank": "4"}, "capabilities.max_rank", "expected an integer"),
        ({"operations": "max"}, "capabilities.operations", "expected a list"),
        ({"colour": 1}, "capabilities.colour", "unknown key 'colour'"),
    ],
)
def test_a_bad_config_declaration_is_located(caps, where, words):
    text = json.dumps({**CONFIG, "capabilities": caps}, indent=1)
    with pytest.raises(ConfigError) as e:
        parse_config(text, "mine.json")
    assert e.value.message.startswith(where) and words in e.value.message
    assert e.value.span is not None and e.value.span.line > 1  # at its place in the file


def capabilities_of(tmp_path, greeting: dict) -> Capabilities:
    dev = device(tmp_path, greeting)
    try:
        return dev.capabilities
    finally:
        dev._discard()


def test_a_version_2_handshake_declares(tmp_path):
    caps = {"operations": ["add", "max"], "max_rank": 2, "tolerance": "exact"}
    got = capabilities_of(tmp_path, {**V1, "version": 2, "capabilities": caps})
    assert got.declared == Declared(operations=("add", "max"), max_rank=2, tolerance="exact")
    assert got.dtypes == frozenset({DType.INT32})
    assert capabilities_of(tmp_path, {**V1, "version": 2}).declared is None  # declaring is optional


def test_a_version_1_handshake_is_still_taken_and_declares_nothing(tmp_path):
    got = capabilities_of(tmp_path, V1)
    assert got.declared is None and got.dtypes == frozenset({DType.INT32})
    # a version 1 backend's unknown fields are ignored, as the protocol says
    assert capabilities_of(tmp_path, {**V1, "capabilities": {"operations": ["nonsense"]}}).declared is None


@pytest.mark.parametrize(
    "caps, words",
    [({"operations": ["maxx"]}, "unknown operation 'maxx'"), ({"speed": 9}, "unknown key 'speed'"),
     (["max"], "not an object"), ({"operations": [1]}, "not a list of strings")],
)
def test_bad_capabilities_in_a_handshake_are_named(tmp_path, caps, words):
    dev = device(tmp_path, {**V1, "version": 2, "capabilities": caps})
    with pytest.raises(TileBackendError) as e:
        dev.capabilities  # noqa: B018 - the first look starts it
    assert "broke the protocol in its handshake: it announced capabilities that are wrong" in e.value.message
    assert words in e.value.message


def test_serve_announces_a_declaration(monkeypatch):
    from backends import registry

    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"llvm_cpu.0 unavailable: {registry.unavailable()}")
    import copy

    dev = copy.copy(registry.get("llvm_cpu.0"))
    declared = Declared(operations=("add", "agg_sum"))
    dev.capabilities = Capabilities(dev.capabilities.dtypes, declared=declared)
    monkeypatch.setitem(registry.devices(), "declaring_cpu.0", dev)
    greeting = hello("declaring_cpu.0")
    assert greeting["version"] == 2 and greeting["capabilities"] == {"operations": ["add", "agg_sum"]}
    assert "capabilities" not in hello("llvm_cpu.0")  # nothing declared: nothing announced
