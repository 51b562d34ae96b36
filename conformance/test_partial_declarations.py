"""A device that declares only some types still meets the sweeps (``sweeps.within``): each sweep
holds every integer and float type at once, so without narrowing, a device lacking int64 would
meet every sweep but the closed ones as "declared unsupported" and be checked on none of them."""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from conformance import sweeps
from conformance.coverage import dtypes_used
from conformance.elementwise_strategies import _sweep_pool
from conformance.test_options import needs_llvm, rows, suite
from tile.ast import format_program
from tile.dtypes import DType
from tile.inputs import input_types

WIDE = {DType.INT64, DType.UINT64}
# a plugin: DEVICE declares every dtype but int64 and uint64 (the suite's child run loads it)
SUBSET = """
import dataclasses

from backends import registry
from tile.capabilities import Declared
from tile.dtypes import DType


def pytest_configure(config):
    dev = registry.get({device!r})
    keep = [d for d in DType if d not in (DType.INT64, DType.UINT64)]
    dev.capabilities = dataclasses.replace(dev.capabilities, declared=Declared(dtypes=keep))
"""


def _same(got: np.ndarray, want: np.ndarray, name: str) -> None:
    """``got`` is ``want``: the same type, and the same values where NaNs are compared as NaNs
    (``assert_array_equal`` took two NaNs of an ml_dtypes type for different on the GPU machine,
    numpy 2.5.2, and for equal here, numpy 2.4.6)."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), name
    if got.dtype.kind in "fcV":  # V: ml_dtypes' bfloat16 and float8 types
        nan = np.isnan(got)
        assert (nan == np.isnan(want)).all(), f"{name}: NaN at other places"
        got, want = got[~nan], want[~nan]
    assert (got == want).all(), f"{name} ({got.dtype}): {got} != {want}"


def _bound(source, inputs):
    prog = tile.parse(source)
    return prog, tile.bind(prog, input_types(prog, inputs), inputs)


@pytest.mark.parametrize("kind", ["elementwise", "contraction"])
def test_a_sweep_narrowed_to_the_declared_types_keeps_the_other_outputs(kind):
    if kind == "elementwise":
        also = (np.float32, _sweep_pool(np.float32))
        src, inputs = sweeps.elementwise_program(np.int64, 5, _sweep_pool(np.int64), False, False, also)
    else:
        src, inputs, _ = sweeps.contraction_program(np.int64, 5)
    prog, bound = _bound(src, inputs)
    assert WIDE <= dtypes_used(bound)
    narrowed = sweeps.within(prog, bound, lambda dt: dt not in WIDE, lambda op: True)
    assert narrowed is not None
    taken = {i.name: inputs[i.name] for i in narrowed.inputs}
    nprog, nbound = _bound(format_program(narrowed), taken)
    used = dtypes_used(nbound)
    assert not used & WIDE
    # every other integer type is still there (int8 .. uint32), and for elementwise the float type
    assert {DType.INT8, DType.UINT8, DType.INT16, DType.UINT16, DType.INT32, DType.UINT32} <= used
    assert kind == "contraction" or DType.FLOAT32 in used
    assert len(narrowed.stmts) >= len(prog.stmts) / 3
    whole, part = ref_interp.run(bound, inputs), ref_interp.run(nbound, taken)
    assert set(part) == set(nprog.output_names) and set(part) < set(whole)
    for name, value in part.items():  # the same outputs, computed alone (a NaN as a NaN, any sign)
        _same(value, whole[name], name)
    # by operation too: no sum left where agg_sum is not run
    no_sum = sweeps.within(prog, bound, lambda dt: True, lambda op: op != "agg_sum")
    if kind == "contraction":
        assert no_sum is not None and all(getattr(s, "agg", None) != "+" for s in no_sum.stmts)
        assert len(no_sum.stmts) < len(prog.stmts)


def test_only_independent_outputs_are_dropped():
    inputs = {"X": np.arange(6, dtype=np.int64).reshape(2, 3), "Y": np.ones(3, np.int32)}
    chained = "function (X, Y) -> (O, P) { T = X * 2; O = T + 1; P = Y + 1; }"
    prog, bound = _bound(chained, inputs)
    assert sweeps.within(prog, bound, lambda dt: dt not in WIDE, lambda op: True) is None
    apart = "function (X, Y) -> (O, P) { O = X + 1; P = Y + 1; }"
    prog, bound = _bound(apart, inputs)
    assert sweeps.within(prog, bound, lambda dt: True, lambda op: True) is None  # nothing to drop
    narrowed = sweeps.within(prog, bound, lambda dt: dt not in WIDE, lambda op: True)
    assert narrowed.output_names == ("P",) and [i.name for i in narrowed.inputs] == ["Y"]
    assert sweeps.within(prog, bound, lambda dt: dt == DType.BOOL, lambda op: True) is None  # none left


@needs_llvm
def test_a_device_declaring_a_subset_is_checked_on_the_declared_types(tmp_path):
    args = ("--target", "llvm_cpu.0", "--conformance-examples=12", "--conformance-distinguish=0")
    status, out, data = suite(tmp_path, *args, "-k", "elementwise or contractions",
                              plugin=SUBSET.format(device="llvm_cpu.0"))  # fmt: skip
    assert status == 0, out
    by = rows(data)
    assert by[("elementwise", "llvm_cpu.0")]["examples"] >= 10, out
    table = data["coverage"]["llvm_cpu.0"]["table"]
    met = {r["name"]: r["examples"] for r in table if r["category"] == "dtype"}
    assert not met.get("int64") and not met.get("uint64")
    # the sweeps brought every other integer type (the drawn programs use int32 and floats)
    assert all(met.get(t) for t in ("int8", "uint8", "int16", "uint16", "uint32")), met
    narrowed = {d["reason"]: d["examples"] for d in data["narrowed"] if d["target"] == "llvm_cpu.0"}
    assert narrowed and all("int64" in r or "uint64" in r for r in narrowed), narrowed
    assert "narrowed on llvm_cpu.0: " in out and " sweep(s) run without their outputs using " in out


def test_narrowed_sweeps_are_counted_across_workers():
    from conformance.report import Stats

    one = Stats()
    one.narrowed[("d.0", "int64")] += 2
    merged = Stats()
    merged.merge(one.to_json())
    merged.merge(one.to_json())
    assert merged.narrowed[("d.0", "int64")] == 4
    counted = merged.summary("ci", "0/1", 1.0)["narrowed"]
    assert counted == [{"target": "d.0", "reason": "int64", "examples": 4}]


@needs_llvm
def test_a_seeded_defect_on_a_declared_type_is_still_caught(tmp_path):
    """``stripe_uint16_temporaries_int16`` (uint16 temporaries held as int16) shows in uint16
    division, comparison and widening, which the elementwise sweeps bring beside int64. Before the
    sweeps were narrowed it survived the elementwise family here (40 examples, 6 declared
    unsupported: every non-closed sweep), as did ``stripe_as_uint8_as_16`` and ``llvm_zext_as_sext``;
    all three are killed now."""
    target = "mutant:stripe_uint16_temporaries_int16"
    status, out, data = suite(tmp_path, "--target", target, "-x", "-k", "elementwise",
                              "--conformance-distinguish=0", plugin=SUBSET.format(device=target))  # fmt: skip
    assert status == 1, out
    assert rows(data)[("elementwise", target)]["failed"] == 1
    folder = data["failures"][0]["folder"]  # the failing example runs in the declared types only
    with np.load(f"{folder}/inputs.npz") as inputs:
        assert inputs.files and not {str(inputs[k].dtype) for k in inputs.files} & {"int64", "uint64"}
