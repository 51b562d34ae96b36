"""On an AVX-512 host, LLVM's loop vectorizer widens plain loops to 512-bit vectors
(backends/llvm/host.py turns off the ``prefer-256-bit`` tuning): elementwise kernels such as GELU's
erf polynomial run 16 floats at a time."""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest

from backends.llvm.host import host_target, target_machine

LOOP = """
define void @scale(ptr noalias %x, ptr noalias %y, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %v = load float, ptr %px
  %w = fmul float %v, 3.0
  %z = fadd float %w, 1.0
  %py = getelementptr inbounds float, ptr %y, i64 %i
  store float %z, ptr %py
  %next = add nsw i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""


def test_plain_loops_vectorize_512_bits_wide():
    cpu, features = host_target()
    if "+avx512f" not in features.split(","):
        pytest.skip("the host has no AVX-512 (512-bit vectors need avx512f)")
    tm = target_machine(cpu, features)
    mod = llvm.parse_assembly(f'target triple = "{llvm.get_process_triple()}"\n' + LOOP)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    asm = tm.emit_assembly(mod)
    assert "zmm" in asm, "the loop vectorizer kept 256-bit vectors"
