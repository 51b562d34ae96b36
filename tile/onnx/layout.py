"""Channels-last copies kept beside channels-first tensors, so that a convolution's neighbours
read and write the layout its kernels want (``llvm_cpu.0`` runs the channels-last convolution 3 to
10 times faster, bench/RESULTS.md).

ONNX is channels-first ([N, C, spatial..]); the Conv converter computes channels-last
([N, spatial.., C]) between two permutations. Each permutation is a copy, and an activation or a
pooling between two convolutions would read the channels-first copy and make the next convolution
permute again. So ``from_last`` records, for the channels-first result, the channels-last tensor it
was permuted from (``Builder.channels_last``), and the converters that can compute in either layout
(the unary activations, MaxPool, the global poolings, Conv's input) take that one (``last_of``) and
record their own result alike. A permutation no one reads is dropped by Tile's dead-code
elimination, so a chain Conv -> Relu -> MaxPool -> Conv runs without a copy between.
"""

from __future__ import annotations

from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import permute


def last_of(ctx: Context, v: Value) -> Value | None:
    """The channels-last tensor holding channels-first ``v``'s values, where one was recorded."""
    return ctx.b.channels_last.get(v.name) if v.name is not None else None


def to_last(ctx: Context, v: Value, hint: str) -> Value:
    """Channels-first ``v`` as channels-last: the recorded copy, else a permutation."""
    found = last_of(ctx, v)
    return found if found is not None else permute(ctx, v, [0, *range(2, v.rank), 1], hint)


def from_last(ctx: Context, y: Value, hint: str) -> Value:
    """Channels-last ``y`` permuted to channels-first, recorded as having ``y`` beside it."""
    out = permute(ctx, y, [0, y.rank - 1, *range(1, y.rank - 1)], hint)
    ctx.b.channels_last[out.name] = y
    return out
