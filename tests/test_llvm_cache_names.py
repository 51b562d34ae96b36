"""Two programs whose kernels are the same code under other names share no disk-cache entry: the
object's functions are named after the kernels, so a module built for one has no function of the
other's names (its address was 0, and the call crashed the process: the AVX-512 width change of
this session exposed it in tests/test_pass_scalarize.py, by a hand-written Stripe kernel meeting a
compiled one)."""

import numpy as np
import pytest

import tile
from stripe.parser import parse_stripe
from tests.llvm_runner import execute

NEG = """0: #program block [] ( // program
    #input #user none X[0, 0] fp32(1:1, 1:1)
    #output #user none T0[0, 0] fp32(1:1, 1:1)
) {
  0: #main block [] ( // main
      in X[0, 0] fp32(1:1, 1:1)
      out T0[0, 0] fp32(1:1, 1:1)
  ) {
    0: #eltwise #eltwise_neg #kernel block [] ( // k0_T0
        in X[0, 0] fp32(1:1, 1:1)
        out T0[0, 0]:assign fp32(1:1, 1:1)
    ) {
      0: $X = load(X)
      1: $t1 = neg($X):fp32
      2: T0 = store($t1)
    }
  }
}"""


def test_kernels_alike_up_to_names_do_not_share_an_object(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    x = np.full((1, 1), 2.0, np.float32)
    compiled = tile.compile("function (X[N, M]) -> (T0) { T0 = -X; }", device="llvm_cpu.0")
    assert compiled({"X": x})["T0"][0, 0] == -2.0  # its module is cached under its kernel's name
    got, _ = execute(parse_stripe(NEG), {"X": x})  # the same code as kernel k0_T0
    assert got["T0"][0, 0] == -2.0


def test_a_module_without_a_kernels_function_is_refused_not_called(monkeypatch):
    """Were the object's functions ever named otherwise than the lookup expects, the build says so
    (a TileRuntimeError naming the function and the way out) instead of calling address 0."""
    import backends.llvm.device as llvm_device
    from backends.hal import kernel_symbol

    monkeypatch.setattr(llvm_device, "kernel_symbol", lambda k, info: kernel_symbol(k, info) + "_elsewhere")
    with pytest.raises(tile.TileRuntimeError, match="defines no function tile_k0_.*_elsewhere") as e:
        tile.compile("function (X[N]) -> (T) { T = -X; }", device="llvm_cpu.0",
                     settings={"cache": False})({"X": np.ones(3, np.float32)})
    assert "cache=False" in e.value.hint
