"""The convolution, pooling and normalization converters (``tile/onnx/ops_nn.py``) against ONNX's
own node cases, on the interpreter and ``llvm_cpu.0``, in the default test run (the whole node
suite runs with ``pytest conformance/ --onnx``). One case per attribute the converters work out at
import: per-side and SAME pads, ``ceil_mode``, dilations, pooling counts with and without the
padding, ``output_shape``, training-mode statistics, per-group scale, zero points, past state.
Each is compared with the case's own rtol/atol (exactly for integers), as the suite does.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")

from conformance import onnx_nodes  # noqa: E402

CASES = [
    "test_conv_with_autopad_same",
    "test_conv_with_strides_and_asymmetric_padding",
    "test_convtranspose_output_shape",
    "test_convtranspose_autopad_same",
    "test_convtranspose_pads",
    "test_convtranspose_group_2",
    "test_maxpool_2d_ceil",
    "test_maxpool_2d_dilations",
    "test_maxpool_2d_same_lower",
    "test_maxpool_2d_uint8",
    "test_maxpool_with_argmax_2d_precomputed_pads",
    "test_maxpool_with_argmax_2d_precomputed_strides",
    "test_maxunpool_export_with_output_shape",
    "test_averagepool_2d_pads_count_include_pad",
    "test_averagepool_2d_same_upper",
    "test_averagepool_2d_ceil",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
    "test_lppool_2d_pads",
    "test_globalaveragepool",
    "test_globalmaxpool",
    "test_batchnorm_epsilon_training_mode",
    "test_instancenorm_example",
    "test_group_normalization_example",
    "test_layer_normalization_3d_axis1_epsilon",
    "test_lrn",
    "test_rms_normalization_3d_axis1_epsilon",
    "test_l1normalization_axis_0",
    "test_mvn",
    "test_convinteger_with_padding",
    "test_qlinearconv",
    "test_causal_conv_with_state_with_bias_and_past_state",
]


@pytest.fixture(scope="module")
def cases():
    return onnx_nodes.cases()


@pytest.mark.parametrize("target", ["interp", "llvm_cpu.0"])
@pytest.mark.parametrize("name", CASES)
def test_node_case(cases, name, target):
    from backends import registry

    if name not in cases:
        pytest.skip(f"this onnx ({__import__('onnx').__version__}) has no case {name}")
    device = None
    if target != "interp":
        if target not in registry.devices():
            pytest.skip(f"{target} is not available here")
        device = registry.get(target)
    record = onnx_nodes.run(name, target, device)
    assert (record.status, record.reason) == ("passed", ""), f"{name} on {target}"
