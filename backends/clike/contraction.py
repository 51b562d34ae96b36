"""The GEMM analysis, now ``stripe.gemm`` (the optimizer's ``gemm_tile`` pass uses it too): this
module keeps its names for the code generator's imports."""

from stripe.gemm import FLOATS, MIN_SIDE, Gemm, Group, Operand, element_offset, match, one_to_one

__all__ = ["FLOATS", "MIN_SIDE", "Gemm", "Group", "Operand", "element_offset", "match", "one_to_one"]
