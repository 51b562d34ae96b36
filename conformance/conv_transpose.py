"""PlaidML 0.7's transposed convolutions as Tile programs, with a numpy reference.

``ConvT.source()`` writes the program the way ``plaidml/op.py``'s ``ConvolutionTranspose`` did
(Keras' kernel layout ``K[LK0.., CI, CO]``, channels-last or channels-first data): each output
spatial size is a 0-D input ``D<i>`` and the padding ``Pad<i>`` is computed from it as
``pad_compute`` wrote it. ``KERAS`` holds the configurations of PlaidML 0.7's
``plaidml/keras/backend_test.py`` (``testConv2dTranspose``, ``testConv3dTranspose``). Used by the
``sized`` family of ``strategies.py``, ``tests/test_size_inputs.py`` and
``test_plaidml_peer_sizes.py``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


def pad_expr(d: str, stride: int, span: int, padding: str) -> str:
    """Pad<i> as Tile text (``span`` is the dilated kernel size); ``padding`` is valid,
    same_upper, same_lower or an explicit integer."""
    if padding == "valid":
        return "0"
    if padding.isdigit():
        return padding
    out = f"({d} + {stride} - 1) / {stride}"
    inner = f"max(0, ({out} - 1) * {stride} + {span} - {d})"
    return f"({inner}) / 2" if padding == "same_upper" else f"(({inner}) + 1) / 2"


def pad_value(size: int, stride: int, span: int, padding: str) -> int:
    """What ``pad_expr`` computes, in Python."""
    if padding == "valid":
        return 0
    if padding.isdigit():
        return int(padding)
    total = max(0, ((size + stride - 1) // stride - 1) * stride + span - size)
    return total // 2 if padding == "same_upper" else (total + 1) // 2


@dataclass(frozen=True)
class ConvT:
    """One transposed convolution: O of ``o_shape`` (with CO channels), a kernel of spatial size
    ``kernel`` making ``ci`` channels, and the output spatial ``sizes`` to try with it."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    padding: str
    o_shape: tuple[int, ...]
    ci: int
    sizes: tuple[tuple[int, ...], ...]
    dilation: tuple[int, ...] | None = None
    channels_first: bool = False

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def dilations(self) -> tuple[int, ...]:
        return self.dilation or (1,) * self.rank

    def span(self, i: int) -> int:
        return self.dilations()[i] * (self.kernel[i] - 1) + 1

    def source(self) -> str:
        r = range(self.rank)

        def lay(batch: str, channel: str, spatial: list[str]) -> str:
            parts = [batch, channel, *spatial] if self.channels_first else [batch, *spatial, channel]
            return ", ".join(parts)

        pads = "".join(
            f"Pad{i} = {pad_expr(f'D{i}', self.strides[i], self.span(i), self.padding)};\n    " for i in r
        )
        spatial = [f"{self.strides[i]}*x{i} + {self.dilations()[i]}*k{i} - Pad{i}" for i in r]
        kdims = ", ".join([*(f"LK{i}" for i in r), "CI", "CO"])
        kidx = ", ".join([*(f"k{i}" for i in r), "ci", "co"])
        return (
            f"function (O[{lay('N', 'CO', [f'L{i}' for i in r])}], K[{kdims}], "
            f"{', '.join(f'D{i}' for i in r)}) -> (I) {{\n"
            f"    {pads}I[{lay('n', 'ci', spatial)}: {lay('N', 'CI', [f'D{i}' for i in r])}] = "
            f"+(O[{lay('n', 'co', [f'x{i}' for i in r])}]*K[{kidx}]);\n}}"
        )

    def inputs(self, rng: np.random.Generator, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
        """Small integers, so every sum is exact in float32."""
        co = self.o_shape[1] if self.channels_first else self.o_shape[-1]
        o = rng.integers(-3, 4, self.o_shape).astype(dtype)
        k = rng.integers(-3, 4, (*self.kernel, self.ci, co)).astype(dtype)
        return o, k

    def reference(self, o: np.ndarray, k: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
        """I[n, s*x + d*k - P, ci] += O[n, x, co] * K[k, ci, co] over the positions inside I."""
        return self.reference_and_count(o, k, size)[0]

    def reference_and_count(self, o, k, size: tuple[int, ...]) -> tuple[np.ndarray, int]:
        """The reference and how many (x, k) pairs land inside I (none: an empty index space)."""
        if self.channels_first:
            o = np.moveaxis(o, 1, -1)
        pads = [pad_value(size[i], self.strides[i], self.span(i), self.padding) for i in range(self.rank)]
        s, d = self.strides, self.dilations()
        out = np.zeros((o.shape[0], *size, self.ci), np.float64)
        count = 0
        for xs in itertools.product(*(range(n) for n in o.shape[1:-1])):
            for ks in itertools.product(*(range(n) for n in self.kernel)):
                pos = tuple(s[i] * xs[i] + d[i] * ks[i] - pads[i] for i in range(self.rank))
                if all(0 <= p < n for p, n in zip(pos, size)):
                    out[(slice(None), *pos)] += o[(slice(None), *xs)] @ k[ks].T
                    count += 1
        return (np.moveaxis(out, -1, 1) if self.channels_first else out), count

    def out_shape(self, size: tuple[int, ...]) -> tuple[int, ...]:
        n = self.o_shape[0]
        return (n, self.ci, *size) if self.channels_first else (n, *size, self.ci)


def size_arrays(size: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The 0-D inputs D0, D1, ... for output spatial sizes ``size``."""
    return {f"D{i}": np.int32(s) for i, s in enumerate(size)}


def keras(x, k, out, strides, padding, data_format, dilation=None) -> ConvT:
    """A ``conv2d_transpose``/``conv3d_transpose`` call of PlaidML's Keras tests as a ConvT: x is
    O's shape, k the Keras kernel's (LK.., CI, CO), out the output shape."""
    first = data_format == "channels_first"
    size = tuple(out[2:] if first else out[1:-1])
    pad = {"same": "same_upper", "valid": "valid"}[padding]
    dil = None if dilation is None or set(dilation) == {1} else tuple(dilation)
    return ConvT(tuple(k[:-2]), tuple(strides), pad, tuple(x), k[-2], (size,), dil, first)


# plaidml/keras/backend_test.py (0.7.0): testConv2dTranspose, testConv3dTranspose
KERAS = {
    "keras2d_0": keras((1, 1, 3, 1), (1, 4, 1, 1), (1, 1, 9, 1), (1, 4), "same", "channels_last"),
    "keras2d_1": keras((1, 3, 3, 1), (3, 3, 1, 1), (1, 5, 5, 1), (2, 2), "same", "channels_last"),
    "keras2d_2": keras((1, 2, 2, 1), (3, 3, 1, 1), (1, 5, 5, 1), (2, 2), "valid", "channels_last"),
    "keras2d_3": keras((1, 5, 3, 7), (5, 5, 4, 7), (1, 9, 10, 4), (1, 2), "valid", "channels_last"),
    "keras2d_4": keras((1, 5, 3, 7), (5, 5, 4, 7), (1, 9, 9, 4), (1, 2), "valid", "channels_last"),
    "keras2d_5": keras((4, 8, 5, 5), (3, 3, 2, 8), (4, 2, 9, 9), (2, 2), "same", "channels_first"),
    "keras2d_6": keras((4, 3, 5, 8), (3, 3, 2, 8), (4, 9, 9, 2), (3, 2), "same", "channels_last"),
    "keras2d_7": keras((1, 1, 6, 1), (7, 1, 1, 1), (1, 1, 22, 1), (4, 1), "same", "channels_first"),
    "keras2d_8": keras((1, 1, 4, 1), (7, 1, 1, 1), (1, 1, 22, 1), (4, 1), "valid", "channels_first"),
    "keras2d_9": keras((1, 8, 9, 3), (3, 2, 3, 3), (1, 8, 9, 3), (1, 1), "same", "channels_last", (2, 2)),
    "keras3d_0": keras((1, 3, 3, 3, 1), (3, 3, 4, 2, 1), (1, 5, 7, 9, 2), (2, 3, 4), "same", "channels_last"),
    "keras3d_1": keras(
        (1, 1, 2, 8, 4), (4, 1, 2, 1, 1), (1, 1, 7, 8, 14), (3, 1, 4), "valid", "channels_first"
    ),
}

# Our own: several output sizes for one O, each padding, a dilation, and an empty output.
OWN = {
    "same_upper_s2": ConvT((3,), (2,), "same_upper", (2, 4, 3), 2, ((7,), (8,))),
    "same_lower_s2": ConvT((3,), (2,), "same_lower", (2, 4, 3), 2, ((7,), (8,))),
    "valid_s2": ConvT((3,), (2,), "valid", (2, 4, 3), 2, ((9,), (10,))),
    "valid_s1": ConvT((2,), (1,), "valid", (2, 5, 3), 2, ((6,), (3,))),
    "explicit_s3": ConvT((3,), (3,), "1", (2, 3, 3), 2, ((7,), (8,), (9,))),
    "same_dilated": ConvT((2,), (2,), "same_upper", (2, 3, 3), 2, ((5,), (6,)), (2,)),
    "same_2d": ConvT((3, 2), (2, 1), "same_upper", (2, 3, 2, 3), 2, ((5, 2), (6, 2))),
    "same_2d_channels_first": ConvT(
        (3, 2), (2, 1), "same_upper", (2, 3, 3, 2), 2, ((5, 2), (6, 2)), channels_first=True
    ),
    "empty_output": ConvT((3,), (2,), "same_upper", (2, 4, 3), 2, ((0,),)),
}

CASES = {**OWN, **KERAS}
