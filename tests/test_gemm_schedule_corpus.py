"""The tiled GEMM kernels of a broad corpus (``tests/gemm_corpus.py``: fp16, bf16, tf32, 3xtf32,
fp32 and fp64; ``mma.sync``, warp-group and TMA-fed kernels and the SIMT one; aligned and odd
shapes, K not a whole number of steps, batched, transposed operands, a fused epilogue, valid and
padded convolutions) generate byte for byte what was recorded from the code before the GEMM
emitter became a schedule and a renderer. No GPU here: the text is the proof that the kernels
are the ones measured and checked on the GPU machine. A deliberate change of a kernel records
the fixture again (``python -m tests.gemm_corpus --record``) and says why in its commit."""

from __future__ import annotations

import pytest

from tests import gemm_corpus

CORPUS = gemm_corpus.load()


def test_the_corpus_covers_every_kernel_family():
    """Launched (TMA) kernels, warp-group ones, warp-level ones, SIMT ones and fused epilogues."""
    names = [k["name"] for c in CORPUS.values() for k in c["kernels"]]
    launched = [k for c in CORPUS.values() for k in c["kernels"] if k["launch"]]
    assert {m for m in ("f16", "bf16", "tf32", "3xtf32") if any(n.endswith(m) for n in map(
        lambda k: k["name"], launched))} == {"f16", "bf16", "tf32", "3xtf32"}
    assert any("r16x" in n and n.endswith("f16") and not n.endswith("bf16") for n in names)  # warp group
    assert any("r32x32" in n for n in names)  # warp-level
    assert any(n.endswith("r4x4k16") for n in names)  # SIMT
    assert len(CORPUS) >= 200


@pytest.mark.parametrize("cid", sorted(CORPUS))
def test_the_kernels_are_the_recorded_ones(cid):
    case = CORPUS[cid]
    got = gemm_corpus.generate_from_text(case["stripe"], case["profile"], case["strict"])
    why = (f"{cid}: the kernels differ from the recorded ones (to see how: `python -m tests.gemm_corpus "
           "--dump DIR` at the recorded commit and now, then diff the two folders)")
    assert [gemm_corpus.record_of(k) for k in got] == case["kernels"], why
