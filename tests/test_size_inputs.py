"""0-D inputs used as sizes (docs/semantics.md §6.3.1): PlaidML 0.7's transposed convolutions.

The programs are written the way PlaidML 0.7's op library (``plaidml/op.py``,
``ConvolutionTranspose``) generated them (``conformance/conv_transpose.py``): the output size of
each spatial axis is a 0-D input ``D<i>`` and the padding ``Pad<i>`` is computed from it. They are
checked on the interpreter, on ``llvm_cpu.0`` and on OpenCL (where present) against a numpy
transcription of the transposed convolution, on integer-valued inputs (exact), for the
configurations of PlaidML's Keras tests, our own and drawn ones. Then the rule's edges: located
errors for bad values, ``tile check``, ``tile run``, the build cache key, device tensors,
gradients.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import sympy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from backends import registry
from conformance.conv_transpose import CASES, OWN, ConvT, size_arrays
from conformance.strategies import transposed
from stripe.lower import lower
from tests.gradcheck import assert_close, fd_grad
from tests.opencl_support import DEVICE_ID as OPENCL
from tests.opencl_support import requires_opencl
from tile.api import grad_values
from tile.api import tensor as tile_tensor
from tile.bind import bind
from tile.cli import main
from tile.errors import TileError, TileIndexError, TileInputError, TileShapeError
from tile.inputs import input_types
from tile.size_inputs import size_uses

RNG = np.random.default_rng(15)
CT = OWN["same_upper_s2"].source()


def ints(*shape: int) -> np.ndarray:
    return RNG.integers(-3, 4, shape).astype(np.float32)


def test_generated_source_is_plaidmls():
    want = (
        "function (O[N, L0, CO], K[LK0, CI, CO], D0) -> (I) {\n"
        "    Pad0 = (max(0, ((D0 + 2 - 1) / 2 - 1) * 2 + 3 - D0)) / 2;\n"
        "    I[n, 2*x0 + 1*k0 - Pad0, ci: N, D0, CI] = +(O[n, x0, co]*K[k0, ci, co]);\n}"
    )
    assert CT == want
    first = OWN["same_2d_channels_first"].source()
    assert first.startswith("function (O[N, CO, L0, L1], K[LK0, LK1, CI, CO], D0, D1) -> (I) {")
    assert "I[n, ci, 2*x0 + 1*k0 - Pad0, 1*x1 + 1*k1 - Pad1: N, CI, D0, D1] = +(O[n, co, x0, x1]*" in first


@pytest.mark.parametrize("name", CASES)
def test_conv_transpose_interpreter(name):
    c = CASES[name]
    src, (o, k) = c.source(), c.inputs(RNG)
    for size in c.sizes:
        got = ref_interp.run(src, {"O": o, "K": k, **size_arrays(size)})["I"]
        assert got.dtype == np.float32 and got.shape == c.out_shape(size)
        np.testing.assert_array_equal(got, c.reference(o, k, size))


@settings(derandomize=True, deadline=None, max_examples=80)
@given(transposed(), st.integers(0, 99))
def test_drawn_conv_transposes(case, seed):
    """Any transposed convolution against numpy (more, compiled, in conformance's sized family)."""
    c, size = case
    (o, k), src = c.inputs(np.random.default_rng(seed)), c.source()
    want, count = c.reference_and_count(o, k, size)
    if count == 0 and want.size:  # no (x, k) lands in I: an empty index space (§6.7)
        with pytest.raises(TileIndexError, match="no index tuple of 'I' is valid"):
            ref_interp.run(src, {"O": o, "K": k, **size_arrays(size)})
        return
    np.testing.assert_array_equal(ref_interp.run(src, {"O": o, "K": k, **size_arrays(size)})["I"], want)


@pytest.mark.usefixtures("private_cache")
@settings(derandomize=True, deadline=None, max_examples=12)
@given(transposed(), st.integers(0, 99))
def test_drawn_conv_transposes_llvm(case, seed):
    c, size = case
    (o, k), src = c.inputs(np.random.default_rng(seed)), c.source()
    want, count = c.reference_and_count(o, k, size)
    assume(count > 0 or not want.size)
    np.testing.assert_array_equal(tile.compile(src, "llvm_cpu.0")(O=o, K=k, **size_arrays(size))["I"], want)


COMPILED = ["same_upper_s2", "valid_s2", "explicit_s3", "same_dilated", "same_2d_channels_first", "keras2d_5",
            "keras2d_9", "keras3d_0", "keras3d_1"]


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("name", COMPILED)
def test_conv_transpose_llvm(name):
    c = CASES[name]
    exe, (o, k) = tile.compile(c.source(), "llvm_cpu.0"), c.inputs(RNG)
    for size in [*c.sizes, c.sizes[0]]:  # back to the first size: its own build is still right
        np.testing.assert_array_equal(exe(O=o, K=k, **size_arrays(size))["I"], c.reference(o, k, size))


@requires_opencl
@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("name", ["same_2d", "keras2d_5"])
def test_conv_transpose_opencl(name):
    c = CASES[name]
    exe, (o, k) = tile.compile(c.source(), OPENCL), c.inputs(RNG)
    for size in c.sizes:
        np.testing.assert_array_equal(exe(O=o, K=k, **size_arrays(size))["I"], c.reference(o, k, size))


@pytest.mark.usefixtures("private_cache")
def test_an_empty_index_space_is_refused_alike():
    """Found by the sized family: the compiled path named the defracted index ('v1_0'), the
    interpreter the written condition. Both name the written one now."""
    c = ConvT((2, 1), (2, 1), "same_upper", (1, 2, 1, 2), 2, ((1, 1),), (2, 1))
    inputs = {"O": ints(1, 2, 1, 2), "K": ints(2, 1, 2, 2), **size_arrays((1, 1))}
    want = "no index tuple of 'I' is valid: dimension 1 of 'I' (size 1) rules out every tuple"
    with pytest.raises(TileIndexError, match=re.escape(want)):
        ref_interp.run(c.source(), inputs)
    with pytest.raises(TileIndexError, match=re.escape(want)):
        tile.compile(c.source(), "llvm_cpu.0")(inputs)


STRIDED_EMPTY = """function (O[N, L0, L1, CO], K[LK0, LK1, CI, CO], D0, D1) -> (I) {
    Pad0 = (max(0, ((D0 + 1 - 1) / 1 - 1) * 1 + 1 - D0)) / 2;
    Pad1 = (max(0, ((D1 + 2 - 1) / 2 - 1) * 2 + 4 - D1)) / 2;
    I[n, 1*x0 + 1*k0 - Pad0, 2*x1 + 3*k1 - Pad1, ci: N, D0, D1, CI] = +(O[n, x0, x1, co]*K[k0, k1, ci, co]);
}"""


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("device", ["llvm_cpu.0", "opencl_cpu.0"])
def test_a_space_with_no_integer_tuple_is_refused_alike(device):
    """Found by a 40,000-example campaign (sized family, 14 chunks): the rational box is not empty
    but ``2*x1 + 3*k1 - 1`` never lands in ``[0, 1)``; the interpreter refuses, the compiled
    targets answered zeros. They refuse alike now."""
    if device not in registry.ids():
        pytest.skip(f"no {device} here")
    inputs = {"O": np.ones((1, 1, 2, 2), np.float32), "K": np.ones((1, 2, 2, 2), np.float32),
              "D0": np.int32(1), "D1": np.int32(1)}
    want = "no index tuple of 'I' is valid: dimension 2 of 'I' (size 1) rules out every tuple"
    with pytest.raises(TileIndexError, match=re.escape(want)):
        ref_interp.run(STRIDED_EMPTY, inputs)
    with pytest.raises(TileIndexError, match=re.escape(want)):
        tile.compile(STRIDED_EMPTY, device)(inputs)
    inputs["D1"] = np.int32(4)  # a size with valid tuples: answered, equal to the interpreter's
    want_out = ref_interp.run(STRIDED_EMPTY, inputs)["I"]
    np.testing.assert_array_equal(tile.compile(STRIDED_EMPTY, device)(inputs)["I"], want_out)


@pytest.mark.usefixtures("private_cache")
def test_a_device_tensor_holds_a_size():
    """A 0-D tile.Tensor is read for its value; writing another value builds for it."""
    c = OWN["same_upper_s2"]
    exe, (o, k) = tile.compile(c.source(), "llvm_cpu.0"), c.inputs(RNG)
    d = tile_tensor(np.int32(8))
    for size in (8, 7):
        d.write(np.int32(size))
        got = exe(O=tile_tensor(o), K=k, D0=d)["I"]
        np.testing.assert_array_equal(got, c.reference(o, k, (size,)))


@pytest.mark.usefixtures("private_cache")
def test_a_new_value_is_a_new_build():
    """Same shapes, another shift: a program keyed on shapes alone would rerun the first build."""
    src = "function (A[N], S) -> (O) { O[i: N] = +(A[i + S]); }"
    a = np.arange(1, 7, dtype=np.float32)
    exe = tile.compile(src, "llvm_cpu.0")
    for s in (1, 3, 1, 0):
        want = np.concatenate([a[s:], np.zeros(s, np.float32)])
        np.testing.assert_array_equal(exe(A=a, S=np.int64(s))["O"], want)
        np.testing.assert_array_equal(ref_interp.run(src, {"A": a, "S": np.int64(s)})["O"], want)


def test_reshape_to_a_size_input():
    """Reshape's sizes as 0-D inputs, as op.py's Reshape passed symbolic dims."""
    src = "function (I[N], D0) -> (O) { O = reshape(I, D0, N / D0); }"
    i = np.arange(6, dtype=np.int32)
    for d in (1, 2, 3, 6):
        np.testing.assert_array_equal(ref_interp.run(src, {"I": i, "D0": np.int32(d)})["O"], i.reshape(d, -1))


def test_float_and_bool_arrays_holding_whole_numbers_are_sizes():
    src = "function (A[N], S) -> (O) { O[i: S] = +(A[i]); }"
    a = np.array([1, 2, 3], np.int32)
    assert ref_interp.run(src, {"A": a, "S": np.float64(5.0)})["O"].tolist() == [1, 2, 3, 0, 0]
    assert ref_interp.run(src, {"A": a, "S": np.bool_(True)})["O"].tolist() == [1]
    assert ref_interp.run(src, {"A": a, "S": np.uint8(0)})["O"].shape == (0,)


def test_a_size_input_is_an_int32_dimension_in_elementwise_code():
    """Like a dimension: `S / 2` truncates even when S came as a float array."""
    src = "function (A[N], S) -> (O, H, P) { O[i: S] = +(A[i]); H = S / 2; P = A * S; }"
    out = ref_interp.run(src, {"A": np.array([1.5, 2.0], np.float32), "S": np.float32(5)})
    assert out["H"].dtype == np.int32 and out["H"] == 2
    assert out["P"].dtype == np.float32 and out["P"].tolist() == [7.5, 10.0]


def test_size_uses_names_the_first_use_and_its_role():
    prog = tile.parse(CT)
    use = size_uses(prog)
    assert list(use) == ["D0"]
    assert (use["D0"].span.line, use["D0"].span.col) == (2, 22)
    assert use["D0"].what == "through 'Pad0', in an index expression"
    uses = size_uses(tile.parse("function (I[N], A, B, C) -> (O, P) { O = reshape(I, A); P = B + C; }"))
    assert {n: u.what for n, u in uses.items()} == {"A": "as an argument of 'reshape'"}


# ------------------------------------------------------------------------------ errors
ERRORS = {
    "fraction": (np.float32(7.5), TileInputError, "holds 7.5, which is not a whole number"),
    "negative": (np.int32(-2), TileInputError, "holds -2, which is negative"),
    "nan": (np.float64("nan"), TileInputError, "holds nan, which is not a whole number"),
    "infinite": (np.float32("inf"), TileInputError, "holds inf, which is not a whole number"),
    "too_large": (np.uint64(2**63), TileInputError, "does not fit in int64"),
    "not_0d": (np.array([7, 8], np.int32), TileShapeError, "but has shape (2,)"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_bad_size_values_are_located_errors(name):
    value, cls, text = ERRORS[name]
    with pytest.raises(TileError) as info:
        ref_interp.run(CT, {"O": ints(1, 4, 3), "K": ints(3, 2, 3), "D0": value}, name="ct.tile")
    e = info.value
    assert type(e) is cls
    assert "input 'D0' is used as a size (through 'Pad0', in an index expression)" in e.message
    assert text in e.message
    assert (e.span.line, e.span.col) == (2, 22) and e.hint
    shown = str(e)
    assert shown.startswith("ct.tile:2:22:") and "^~" in shown and "hint:" in shown


@pytest.mark.usefixtures("private_cache")
def test_compiled_programs_refuse_bad_sizes_too():
    with pytest.raises(TileInputError, match="which is negative"):
        tile.compile(CT, "llvm_cpu.0")(O=ints(1, 4, 3), K=ints(3, 2, 3), D0=np.int32(-1))


def test_an_input_with_dimensions_cannot_be_a_size():
    src = "function (A[N], S[M]) -> (O) {\n  O[i: S] = +(A[i]);\n}"
    with pytest.raises(TileShapeError) as info:
        ref_interp.run(src, {"A": np.ones(3), "S": np.ones(2)})
    assert "input 'S' is used as a size (in an output size) but has shape (2,)" in info.value.message
    assert (info.value.span.line, info.value.span.col) == (2, 8)
    assert "only a 0-D input can be a size" in info.value.hint


@pytest.mark.parametrize(
    "src",
    ["function (S, A[S]) -> (O) { O[i: S] = +(A[i]); }", "function (A[S], S) -> (O) { O[i: S] = +(A[i]); }"],
)
def test_a_dimension_named_like_a_size_input_must_agree(src):
    a = np.array([1, 2, 3], np.int32)
    assert ref_interp.run(src, {"A": a, "S": np.int32(3)})["O"].tolist() == [1, 2, 3]
    with pytest.raises(TileInputError, match="'S'"):
        ref_interp.run(src, {"A": a, "S": np.int32(4)})


def test_a_program_bound_without_the_values_does_not_run():
    src = "function (A[N], S) -> (O) { O[i: S] = +(A[i]); }"
    prog, arrays = tile.parse(src), {"A": np.ones(3, np.float32), "S": np.int32(2)}
    bound = bind(prog, input_types(prog, arrays))  # no values: S is symbolic
    assert bound.types["O"].shape[0] == sympy.Symbol("S", positive=True, integer=True)
    with pytest.raises(TileInputError, match=r"bound with symbolic sizes \(S\)") as info:
        ref_interp.run(bound, arrays)
    assert (info.value.span.line, info.value.span.col) == (1, 17)
    with pytest.raises(TileInputError, match=r"bound with symbolic sizes \(S\)"):
        lower(bound)  # what every compiled target starts with
    assert ref_interp.run(bind(prog, input_types(prog, arrays), arrays), arrays)["O"].tolist() == [1, 1]


# ------------------------------------------------------------------------ tile check
def test_check_keeps_sizes_symbolic(tmp_path, capsys):
    path = tmp_path / "ct.tile"
    path.write_text(CT + "\n")

    def check(*args: str) -> list[str]:
        assert main(["check", str(path), *args]) == 0
        return [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]

    lines = check()
    assert "D0 int32[] input" in lines
    assert "I float32[N, D0, CI] output" in lines
    assert lines[-1] == f"ok: {path}"
    assert "I float32[2, D0, 5] output" in check("--shape", "O=2x4x3", "--shape", "K=3x5x3")
    path.write_text("function (S, A[S]) -> (O) { O[i: S + 1] = +(A[i]); }\n")
    assert "O float32[S + 1] output" in check()
    assert "O float32[4] output" in check("--shape", "A=3")  # S names A's dimension: it is 3


@pytest.mark.usefixtures("private_cache")
def test_run_makes_up_a_whole_size(tmp_path, capsys):
    path = tmp_path / "ct.tile"
    path.write_text(CT + "\n")
    for target in ("interp", "llvm_cpu.0"):
        assert main(["run", str(path), "--shape", "O=1x4x2", "--shape", "K=3x3x2", "--target", target]) == 0
        head = capsys.readouterr().out.splitlines()[0]
        assert head.startswith("I: float32[1, ") and 0 <= int(head.split(", ")[1]) <= 6, head


# ------------------------------------------------------------------------- gradients
def test_gradient_of_the_other_inputs():
    c = OWN["same_upper_s2"]
    o, k = (a.astype(np.float64) for a in c.inputs(RNG))
    for size in c.sizes:
        inputs = {"O": o, "K": k, **size_arrays(size)}
        got = grad_values(c.source(), inputs, ["O", "K"])
        assert_close(got["O"], fd_grad(c.source(), inputs, "O"), length=3 * 2)
        assert_close(got["K"], fd_grad(c.source(), inputs, "K"), length=2 * 4)


def test_a_size_input_has_no_gradient():
    """An integer size input is not differentiated (as every integer input); a float one is a
    dimension, whose gradient is zero."""
    o, k = OWN["same_upper_s2"].inputs(RNG)
    assert set(grad_values(CT, {"O": o, "K": k, "D0": np.int32(7)})) == {"O", "K"}
    got = grad_values(CT, {"O": o, "K": k, "D0": np.float32(7)}, ["D0"])
    assert got["D0"].shape == () and got["D0"] == 0
