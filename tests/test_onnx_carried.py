"""ONNX types Tile lacks (float8, float4, e8m0, 4- and 2-bit integers), carried in wider Tile types
(``tile.onnx.carried``): conversions to them are rounded by the Tile program and checked against
ml_dtypes, the library ONNX's own reference converts with, on the interpreter and ``llvm_cpu.0``."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="the oracle is ml_dtypes (installed with onnx)")
from onnx import TensorProto, helper  # noqa: E402

import tile.onnx  # noqa: E402
from tile.onnx import TileOnnxError, TileOnnxUnsupported, carried  # noqa: E402

TARGETS = ["interp", "llvm_cpu.0"]
FLOATS = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"]
INTS = ["int4", "uint4", "int2", "uint2"]


def cast_model(src: int, to: int, shape, **attrs):
    node = helper.make_node("Cast", ["x"], ["y"], to=to, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", src, shape)],
                              [helper.make_tensor_value_info("y", to, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])


def hard_floats(fmt: carried.Format) -> np.ndarray:
    """Every value of the type, the midpoints between neighbours (ties), points just beside them,
    values past the largest, subnormals, ±0, ±inf and nan, and random magnitudes."""
    grid = np.unique(np.arange(256, dtype=np.uint8).view(carried.numpy_type(fmt))[
        : 16 if fmt.name.startswith("float4") else 256].astype(np.float64))
    grid = grid[np.isfinite(grid)]
    mids = (grid[1:] + grid[:-1]) / 2
    rng = np.random.default_rng(0)
    random = rng.standard_normal(200) * np.exp2(rng.integers(-20, 20, 200))
    values = np.concatenate([grid, mids, np.nextafter(mids.astype(np.float32), np.inf),
                             np.nextafter(mids.astype(np.float32), -np.inf), random,
                             [fmt.largest * 1.03, fmt.largest * 1.1, 1e30, -1e30, 0.0, -0.0, np.inf, -np.inf,
                              np.nan, 2.0**-40, -(2.0**-40)]])
    return values.astype(np.float32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_a_narrow_float_rounds_as_ml_dtypes(name, saturate, target):
    fmt = carried.BY_NAME[name]
    x = hard_floats(fmt)
    (y,) = tile.onnx.Backend.prepare(cast_model(TensorProto.FLOAT, fmt.elem, x.shape, saturate=saturate),
                                     target).run([x])
    assert y.dtype == carried.numpy_type(fmt)
    clipped = np.clip(x, -fmt.largest, fmt.largest) if saturate else x  # ONNX's saturate_cast
    want = clipped.astype(carried.numpy_type(fmt)).astype(np.float32)
    got = y.astype(np.float32)
    if not fmt.has_nan:
        want = np.where(np.isnan(x), 0, want)  # float4 has no nan: Tile documents 0 for it
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), [(a, b, c) for a, b, c in zip(x[~same], got[~same], want[~same])][:5]
    if fmt.negative_zero:  # -0 stays -0 where the type has it
        assert np.array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", FLOATS)
def test_a_narrow_float_input_converts_exactly(name, target):
    fmt = carried.BY_NAME[name]
    codes = np.arange(16 if name.startswith("float4") else 256, dtype=np.uint8)
    x = codes.view(carried.numpy_type(fmt))
    x = np.unique(x.astype(np.float32)).astype(carried.numpy_type(fmt))
    (y,) = tile.onnx.Backend.prepare(cast_model(fmt.elem, TensorProto.FLOAT16, x.shape), target).run([x])
    np.testing.assert_array_equal(y, x.astype(np.float32).astype(np.float16))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", INTS)
def test_cast_to_a_narrow_integer_wraps_integers_and_zeroes_floats_out_of_range(name, target):
    fmt = carried.BY_NAME[name]
    ints = np.arange(-40, 41, dtype=np.int32)
    (y,) = tile.onnx.Backend.prepare(cast_model(TensorProto.INT32, fmt.elem, ints.shape), target).run([ints])
    assert y.dtype == carried.numpy_type(fmt)
    np.testing.assert_array_equal(y.astype(np.int32), ints.astype(carried.numpy_type(fmt)).astype(np.int32))
    floats = np.array([-9.0, -8.0, -2.5, -0.5, 0.5, 1.9, 3.0, 7.9, 8.0, 15.5, 16.0, np.nan], np.float32)
    m = cast_model(TensorProto.FLOAT, fmt.elem, floats.shape)
    (y,) = tile.onnx.Backend.prepare(m, target).run([floats])
    lo, hi = (-(1 << (fmt.bits - 1)), (1 << (fmt.bits - 1)) - 1) if fmt.signed else (0, (1 << fmt.bits) - 1)
    t = np.trunc(np.nan_to_num(floats, nan=1e9))
    np.testing.assert_array_equal(y.astype(np.int32), np.where((t >= lo) & (t <= hi), t, 0).astype(np.int32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_e8m0_matches_onnx_reference(mode, saturate, target):
    from onnx.numpy_helper import to_float8e8m0

    fmt = carried.BY_NAME["float8_e8m0fnu"]
    x = np.array([0.0, -0.0, 1e-45, 2.0**-127, 3 * 2.0**-128, 2.0**-126, 0.124, 0.25, 0.375, 0.376, 1.1, 1.5,
                  -3.0, 2.0**127, 1.5 * 2.0**127, 3e38, np.inf, -np.inf, np.nan], np.float32)
    m = cast_model(TensorProto.FLOAT, fmt.elem, x.shape, saturate=saturate, round_mode=mode)
    (y,) = tile.onnx.Backend.prepare(m, target).run([x])
    want = to_float8e8m0(x, bool(saturate), mode)
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))


def test_quantize_to_float8_without_saturation_overflows_to_nan():
    x = np.array([1.0, 1000.0, -1000.0, 0.3], np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], saturate=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [1], [0.0])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (y,) = tile.onnx.Backend.prepare(m, "interp").run([x])
    want = (x / 2).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(y.astype(np.float32), want.astype(np.float32))
    assert np.isnan(y.astype(np.float32)[1:3]).all()


def test_arithmetic_on_a_carried_type_is_refused_with_a_hint():
    node = helper.make_node("Add", ["x", "x"], ["y"], name="add_f8")
    t = TensorProto.FLOAT8E4M3FN
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", t, [3])],
                              [helper.make_tensor_value_info("y", t, [3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(TileOnnxUnsupported, match="float8_e4m3fn") as e:
        tile.onnx.to_tile(m)
    assert "Cast" in (e.value.hint or "")


def test_a_carrier_value_the_type_lacks_is_a_clear_error():
    fmt = carried.BY_NAME["float8_e4m3fn"]
    np.testing.assert_array_equal(carried.from_carrier(np.array([0.5, 448.0], np.float32), fmt, "y")
                                  .astype(np.float32), [0.5, 448.0])
    with pytest.raises(TileOnnxError, match="0.3"):
        carried.from_carrier(np.array([0.5, 0.3], np.float32), fmt, "output 'y'")
