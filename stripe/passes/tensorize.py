"""``tensorize``: the contraction kernels a matrix unit can run, marked for it.

The seed's tensorize step, for a fixed-function unit of the hardware model
(``stripe.hardware.MatrixUnit``, NVIDIA's tensor cores in ``opencl_gpu``): a kernel with every tag
in ``reqs`` and none in ``skip`` that ``stripe.gemm.match`` reads as a GEMM (matmul, batched
matmul, a convolution as an implicit GEMM; flat or fused with an elementwise epilogue) gets the
tag ``mma_<mode>`` when the unit has an operation for its precision:

* ``f16`` / ``bf16``: float16 / bfloat16 operands, products summed in float32 (the language's
  meaning of such a contraction, docs/semantics.md), rounded once to the output;
* ``tf32``, ``3xtf32``: float32 operands, only when the config's ``float32`` says so (the user's
  ``precision`` setting fills it in, ``backends.driver.config_for``): each operand rounded to TF32
  (``tf32``), or split into a TF32 high part and a TF32 residual whose three cross products are
  summed (``3xtf32``, about float32's accuracy). By default float32 stays on the SIMT path.

``gemm_tile`` then tiles a marked kernel around the unit's operation (warps and K steps, its
``matrix_unit`` param) and names the unit in the nest's plan, which the code generator follows.

A kernel is left alone when it is small (fewer than ``min_macs`` multiply-adds: the unit's
fixed tiles would mostly pad), when B has a guard on its own N indexes (a point the guards skip
must add nothing, not ``0 x inf``; the code generator handles that for A, a padded convolution's
input, and the SIMT kernel for both), or when the hardware has no such unit.
The unit sums a K step's products in its own order, so this pass reorders aggregation (strict mode
skips it, and those kernels stay on the SIMT path).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.gemm import Gemm
from stripe.hardware import Hardware
from stripe.ir import Block
from stripe.passes.gemm_tile import MMA_TAG, GemmTileConfig, analyze, marked
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite
from tile.dtypes import DType

FLOAT32_MODES = ("fp32", "tf32", "3xtf32")
_BY_DTYPE = {"float16": "f16", "bfloat16": "bf16"}  # operand dtype -> mode


@dataclass(frozen=True)
class TensorizeConfig:
    reqs: tuple[str, ...] = ("contraction",)
    unit: str = "tensor_core"  # the hardware's matrix unit
    float32: str = "fp32"  # what float32 contractions may use: fp32 (not the unit), tf32, 3xtf32
    min_macs: int = 1 << 18
    skip: tuple[str, ...] = ("split_partial",)

    def invalid(self):
        if self.float32 not in FLOAT32_MODES:
            modes = ", ".join(FLOAT32_MODES)
            return ("float32", f"'{self.float32}' is not a float32 mode", f"one of {modes}")
        return None


def mode_of(g: Gemm, float32: str) -> str | None:
    """The matrix unit's precision mode for the GEMM ``g`` (None: it stays off the unit)."""
    if g.dtype is DType.FLOAT32:
        return float32 if float32 != "fp32" else None
    return _BY_DTYPE.get(g.dtype.value)


@register("tensorize", TensorizeConfig, reorders=True)
def tensorize(program: Block, cfg: TensorizeConfig, hw: Hardware) -> Block:
    """Marks each kernel the unit can run (module docstring)."""
    unit = hw.matrix_units.get(cfg.unit)
    if unit is None:
        return program  # a device without the unit: the pipeline is unchanged
    probe = GemmTileConfig(reqs=cfg.reqs, skip=cfg.skip)

    def fn(block: Block, ctx: Context) -> Block | None:
        if marked(block) is not None:
            return None
        g = analyze(block, ctx.parent, probe, halves=True)
        if g is None:
            return None
        mode = mode_of(g, cfg.float32)
        if mode is None or unit.operation(mode) is None:
            return None
        if g.m.total * g.n.total * g.batch.total * g.k.total < cfg.min_macs:
            return None
        if any(set(c.vars) & g.n.names for c in g.b.guards):
            return None  # only A's skipped points have a path on the unit (the kernel recounts them)
        return replace(block, tags=block.tags | {MMA_TAG + mode})

    return rewrite(program, fn, cfg.reqs)
