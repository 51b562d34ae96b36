"""Autotuning (``settings={"tune": True}``, ``python -m tile tune``): it picks among the cost
model's ranked tilings by timing them, remembers the choice on disk, and never changes results."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry
from backends.driver import config_for
from backends.tune import tune, with_choices
from stripe.config import target_config
from stripe.lower import lower
from stripe.passes import optimize
from tests.opencl_support import DEVICE_ID as OPENCL
from tile.bind import bind
from tile.cli import main
from tile.inputs import input_types

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
CASES = [
    ("llvm_cpu.0", "llvm_cpu_tiled"),
    pytest.param(
        OPENCL, "opencl_gpu_tiled", marks=pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")
    ),
]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path / "cache"))


def _feed(seed=0, m=48, k=40, n=24):
    rng = np.random.default_rng(seed)
    ints = lambda shape: rng.integers(-3, 4, shape).astype(np.float32)  # noqa: E731
    return {"A": ints((m, k)), "B": ints((k, n))}


def _bound(feed):
    prog = tile.parse(MATMUL)
    return bind(prog, input_types(prog, feed))


@pytest.mark.parametrize("dev, config", CASES)
def test_tuned_and_untuned_results_are_equal(dev, config):
    feed = _feed()
    plain = tile.compile(MATMUL, dev, {"config": config})(feed)
    exe = tile.compile(MATMUL, dev, {"config": config, "tune": True, "tune_candidates": 3})
    tuned = exe(feed)
    np.testing.assert_array_equal(tuned["C"], plain["C"])
    np.testing.assert_array_equal(tuned["C"], feed["A"] @ feed["B"])
    cp = next(iter(exe._compiled.values()))
    assert cp.tuning is not None and not cp.tuning.cached
    ranks = [t.rank for t in cp.tuning.trials]
    assert ranks == [0, 1, 2] and all(t.seconds is not None for t in cp.tuning.trials)
    fastest = min(cp.tuning.trials, key=lambda t: t.seconds)
    assert cp.tuning.choices == {"tile_contractions": {"k1_C": fastest.rank}}


@pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")
def test_opencl_gemm_tiles_are_tuned_too():
    """The default OpenCL config tiles GEMM kernels in its ``gemm_tile`` step: the cost model's
    first few tilings (``GemmModel.ranking``) are timed like autotile's, and remembered."""
    feed = _feed(m=40, k=32, n=24)
    settings = {"tune": True, "tune_candidates": 3}
    exe = tile.compile(MATMUL, OPENCL, settings)
    np.testing.assert_array_equal(exe(feed)["C"], feed["A"] @ feed["B"])
    cp = next(iter(exe._compiled.values()))
    gemm = [t for t in cp.tuning.trials if t.step == "tile_gemms"]
    assert [t.rank for t in gemm] == [0, 1, 2] and gemm[0].tiles == (32, 32, 4, 4, 16)
    fastest = min((t for t in gemm if t.seconds is not None), key=lambda t: t.seconds)
    assert cp.tuning.choices["tile_gemms"] == {"k1_C": fastest.rank}
    again = tile.compile(MATMUL, OPENCL, settings)
    np.testing.assert_array_equal(again(feed)["C"], feed["A"] @ feed["B"])
    cached = next(iter(again._compiled.values())).tuning
    assert cached.cached and cached.choices == cp.tuning.choices


def test_the_choice_is_cached_and_keyed_by_shape():
    feed = _feed()
    settings = {"config": "llvm_cpu_tiled", "tune": True, "tune_candidates": 2}
    first = tile.compile(MATMUL, "llvm_cpu.0", settings)
    first(feed)
    again = tile.compile(MATMUL, "llvm_cpu.0", settings)
    np.testing.assert_array_equal(again(feed)["C"], feed["A"] @ feed["B"])
    cp = next(iter(again._compiled.values()))
    assert cp.tuning.cached and cp.tuning.trials == []
    other = _feed(m=32)
    again(other)
    assert len(again._compiled) == 2 and not list(again._compiled.values())[1].tuning.cached


def test_choices_take_the_cost_models_runners_up():
    """``AutotileConfig.choices`` (the tuner's knob) changes the tiling, and nothing else; an
    empty one is the default behaviour."""
    dev = registry.get("llvm_cpu.0")
    cfg = config_for(dev, {"config": "llvm_cpu_tiled"})
    lowered = lower(_bound(_feed()))
    default = optimize(lowered, cfg)
    assert optimize(lowered, with_choices(cfg, {"tile_contractions": {}})) == default
    second = optimize(lowered, with_choices(cfg, {"tile_contractions": {"k1_C": 1}}))
    assert second != default
    beyond = optimize(lowered, with_choices(cfg, {"tile_contractions": {"k1_C": 10_000}}))  # the last one
    assert beyond.stmts[0].stmts[1].has_tags("contraction")


def test_without_an_autotiled_block_nothing_is_timed():
    feed = _feed()
    bound = _bound(feed)
    dev = registry.get("llvm_cpu.0")
    cfg = target_config("llvm_cpu")
    got = tune(bound, dev, cfg, {"tune": True, "cache": False})
    if any(s.pass_ == "autotile" for s in cfg.passes):
        pytest.skip("the default llvm_cpu config autotiles now")
    assert got.trials == [] and all(not v for v in got.choices.values())


def test_tune_command(tmp_path, capsys):
    src = tmp_path / "mm.tile"
    src.write_text(MATMUL)
    args = [str(src), "--target", "llvm_cpu.0", "--config", "llvm_cpu_tiled", "--shape", "A=48x40",
            "--shape", "B=40x24", "--candidates", "2"]
    assert main(["tune", *args]) == 0
    out = capsys.readouterr().out
    assert "tile_contractions k1_C: candidate 0 tiles " in out and " ms" in out
    assert "candidate 1" in out and "chosen (stored: " in out
    assert main(["tune", *args]) == 0
    assert "chosen (from the cache: " in capsys.readouterr().out
    assert main(["tune", *args, "--retune"]) == 0
    assert "chosen (stored: " in capsys.readouterr().out
    # the compile API finds what the command stored
    exe = tile.compile(MATMUL, "llvm_cpu.0", {"config": "llvm_cpu_tiled", "tune": True, "tune_candidates": 2})
    exe(_feed())
    assert next(iter(exe._compiled.values())).tuning.cached
    assert main(["tune", str(src), "--target", "nope.0", "--shape", "A=2x2", "--shape", "B=2x2"]) == 2


def test_a_device_knob_with_the_defaults_code_is_not_timed():
    """``Device.tuning_space`` candidates are timed against the default build; one that generates
    the default's code (LLVM's ``opt`` changes no IR text) is skipped, and the default kept."""
    from backends.llvm import LlvmCpuDevice

    class Knobs(LlvmCpuDevice):
        def tuning_space(self, library):
            return [{"opt": 3}]

    bound = _bound(_feed())
    dev = Knobs(threads=1)
    got = tune(bound, dev, config_for(dev), {"tune": True, "cache": False})
    codegen = [t for t in got.trials if t.step == "codegen"]
    assert [(t.rank, t.seconds is not None) for t in codegen] == [(0, True), (1, False)]
    assert codegen[1].error == "the same code as candidate 0" and got.settings == {}
