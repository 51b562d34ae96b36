"""Typed per-backend options (``backends.options``): the user's settings parsed once into a frozen
dataclass per backend, with a ``TileSettingsError`` naming the setting, the backend and what it
reads; and the driver's own facts (matrix units, caches, storage types) passed as ``BuildFacts``,
no longer through the user's settings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tile
from backends import driver, registry
from backends.options import (
    NO_FACTS,
    BuildFacts,
    CommonOptions,
    CudaOptions,
    LlvmOptions,
    OpenclOptions,
    build_library,
    takes_facts,
)
from tile.settings import KNOWN, TileSettingsError

CLASSES = (CommonOptions, LlvmOptions, OpenclOptions, CudaOptions)
MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"


def test_defaults_are_the_backends_documented_ones():
    llvm = LlvmOptions.parse({})
    got = (llvm.threads, llvm.opt, llvm.unroll, llvm.sum_block, llvm.min_parallel_points)
    assert got == (None, None, None, 4096, 16384)
    assert llvm.microkernel and llvm.reorder and llvm.cache and not llvm.strict
    assert (OpenclOptions.parse(None).local_size, CudaOptions.parse({}).local_size) == (64, 128)
    assert OpenclOptions.parse({}).async_ is True


def test_values_are_converted_and_the_options_are_frozen_and_hashable():
    caches = {"L2": 1 << 20, "L1": 32768}
    opts = LlvmOptions.parse({"threads": np.int64(3), "strict": 1, "cache_bytes": caches, "opt": None})
    assert opts.threads == 3 and type(opts.threads) is int and opts.strict is True
    assert opts.cache_bytes == (("L1", 32768), ("L2", 1 << 20)) and opts.opt is None  # (None: the default)
    assert hash(opts) == hash(LlvmOptions.parse({"threads": 3, "strict": True,
                                                 "cache_bytes": {"L1": 32768, "L2": 1 << 20}}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.threads = 4  # type: ignore[misc]
    assert OpenclOptions.parse({"async": False}).async_ is False  # (a keyword: the field is async_)


@pytest.mark.parametrize("cls, settings, words", [
    (LlvmOptions, {"threads": "four"}, ["'threads'", "llvm backend", "an integer", "str 'four'"]),
    (LlvmOptions, {"threads": True}, ["'threads'", "an integer", "bool True"]),
    (LlvmOptions, {"strict": "yes"}, ["'strict'", "llvm backend", "True or False"]),
    (LlvmOptions, {"cache_bytes": {"L1": "32k"}}, ["'cache_bytes'", "memory names to byte counts"]),
    (OpenclOptions, {"local_size": 6.5}, ["'local_size'", "opencl backend", "an integer", "float 6.5"]),
    (CudaOptions, {"fast_math": 2}, ["'fast_math'", "cuda backend", "True or False"]),
    (CommonOptions, {"tune_candidates": "4"}, ["'tune_candidates'", "every target"]),
])
def test_a_mistyped_setting_names_itself_the_backend_and_its_settings(cls, settings, words):
    with pytest.raises(TileSettingsError) as err:
        cls.parse(settings)
    text = str(err.value)
    assert all(w in text for w in words), text
    assert f"{cls.who} reads: " + ", ".join(sorted(cls.names())) in text


def test_an_unknown_setting_names_the_backend_and_its_settings():
    with pytest.raises(TileSettingsError, match=r"unknown setting 'treads' for the llvm backend") as err:
        LlvmOptions.parse({"treads": 2})
    assert "min_parallel_points" in str(err.value)


def test_another_backends_setting_is_left_to_it():
    """One settings dict may go to several targets (the conformance suite's, a user's)."""
    assert LlvmOptions.parse({"fast_math": True, "local_size": 32}) == LlvmOptions()
    assert OpenclOptions.parse({"threads": 2, "sum_block": 0}) == OpenclOptions()


def test_every_option_is_a_known_setting_and_every_setting_typed():
    """A setting added to ``tile.settings.KNOWN`` without a typed field (or the reverse) fails here."""
    typed = set()
    for cls in CLASSES:
        assert set(cls.names()) <= set(KNOWN), cls
        typed |= set(cls.names())
    assert typed == set(KNOWN)


def test_the_internal_facts_are_not_settings():
    for name in ("matrix_units", "buffer_dtypes"):
        assert name not in KNOWN
        with pytest.raises(TileSettingsError, match=f"unknown setting '{name}'"):
            tile.compile(MM, "llvm_cpu.0", {name: {}})
        with pytest.raises(TileSettingsError, match=f"unknown setting '{name}' for the opencl backend"):
            OpenclOptions.parse({name: {}})


def test_build_facts_come_from_the_config():
    cfg = driver.config_for(registry.get("llvm_cpu.0"))
    facts = BuildFacts.of(cfg)
    assert set(facts.cache_bytes) == {"L1", "L2"} & set(cfg.hardware.mem_units)
    assert all(facts.cache_bytes[n] == cfg.hardware.mem_bytes(n) for n in facts.cache_bytes)
    assert BuildFacts.of(None) is NO_FACTS and dict(NO_FACTS.matrix_units) == {}


class _Recording:
    """A compiler that records what ``build`` was given (wrapping the real one)."""

    def __init__(self, real, seen):
        self.real, self.seen = real, seen

    def build(self, kernels, settings, facts=NO_FACTS):
        self.seen.append((dict(settings), facts))
        return self.real.build(kernels, settings, facts)


def test_the_driver_passes_facts_not_settings(monkeypatch):
    """The user's settings reach the compiler as given (no ``cache_bytes``/``matrix_units`` added);
    the config's caches come as facts."""
    dev = registry.get("llvm_cpu.0")
    seen = []
    monkeypatch.setattr(dev, "compiler", _Recording(dev.compiler, seen))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = tile.compile(MM, "llvm_cpu.0", {"cache": False, "threads": 1})(A=a, B=a.T)["C"]
    np.testing.assert_array_equal(out, a @ a.T)
    (settings, facts), = seen
    assert settings == {"cache": False, "threads": 1}
    hw = driver.config_for(dev).hardware
    assert dict(facts.cache_bytes) == {n: hw.mem_bytes(n) for n in ("L1", "L2") if n in hw.mem_units}


def test_the_opencl_compiler_gets_the_matrix_units_as_facts(monkeypatch):
    if "opencl_cpu.0" not in registry.devices():
        pytest.skip(f"no opencl_cpu.0 (PoCL): {registry.unavailable().get('opencl_cpu.0')}")
    dev = registry.get("opencl_cpu.0")
    seen = []
    monkeypatch.setattr(dev, "compiler", _Recording(dev.compiler, seen))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = tile.compile(MM, "opencl_cpu.0", {"cache": False})(A=a, B=a.T)["C"]
    np.testing.assert_array_equal(out, a @ a.T)
    (settings, facts), = seen
    assert settings == {"cache": False}
    assert dict(facts.matrix_units) == dict(driver.config_for(dev).hardware.matrix_units or {})


def test_a_plugin_compiler_without_facts_is_called_as_before():
    class Old:
        def build(self, kernels, settings):
            return ("old", kernels, settings)

    class New:
        def build(self, kernels, settings, facts=NO_FACTS):
            return ("new", facts)

    assert not takes_facts(Old()) and takes_facts(New())
    facts = BuildFacts(buffer_dtypes={"A": "float32"})
    assert build_library(Old(), [1], {"cache": False}, facts) == ("old", [1], {"cache": False})
    assert build_library(New(), [1], {}, facts) == ("new", facts)


def test_a_mistyped_llvm_setting_is_refused_through_tile_compile():
    a = np.ones((2, 2), np.float32)
    with pytest.raises(TileSettingsError, match="setting 'sum_block' of the llvm backend must be an integer"):
        tile.compile(MM, "llvm_cpu.0", {"sum_block": "big", "cache": False})(A=a, B=a)


@pytest.mark.parametrize("settings", [{}, {"strict": True}, {"cache_bytes": {"L1": 4096, "L2": 65536}},
                                      {"microkernel": False, "threads": 2}])
def test_llvm_results_are_the_interpreters_bit_for_bit(settings):
    """Integer-valued float32 inputs: every order of the sums is exact, so equal means the same."""
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (33, 70)).astype(np.float32)
    b = rng.integers(-4, 5, (70, 19)).astype(np.float32)
    got = tile.compile(MM, "llvm_cpu.0", {"cache": False, **settings})(A=a, B=b)["C"]
    np.testing.assert_array_equal(got, tile.compile(MM, "interp")(A=a, B=b)["C"])


@pytest.mark.parametrize("settings, name", [
    ({"max_buffer_bytes": "1k"}, "max_buffer_bytes"), ({"tiled": "no"}, "tiled"),
    ({"optimize": None, "strict": 2}, "strict"),
])
def test_a_mistyped_common_setting_is_refused_before_building(settings, name):
    """The driver and runner read ``CommonOptions``: a value no code could use is refused by name
    (``max_buffer_bytes="1k"`` was a ValueError from ``int``)."""
    with pytest.raises(TileSettingsError, match=f"setting '{name}' of every target must be"):
        tile.compile(MM, "llvm_cpu.0", {"cache": False, **settings})


def test_the_memory_limit_setting_is_read_typed():
    a = np.ones((8, 8), np.float32)
    exe = tile.compile(MM, "llvm_cpu.0", {"cache": False, "max_buffer_bytes": np.int64(64)})
    with pytest.raises(tile.TileResourceError, match="the max_buffer_bytes setting"):
        exe(A=a, B=a)
