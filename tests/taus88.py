"""An independent, deliberately plain reference of PlaidML's PRNG for the tests; not a test module.

Written from L'Ecuyer's published taus88 ("Maximally equidistributed combined Tausworthe
generators", Math. Comp. 65, 1996) and PlaidML 0.7's description of its kernel: 2048 streams,
stream ``t`` is column ``t`` of the uint32 [3, 2048] state, element ``i`` of a draw (row-major)
comes from stream ``i % 2048`` after one step, and the value is ``float32(s1 ^ s2 ^ s3) / 2**32``.
Python ints, one element at a time, so it shares nothing with ``ref_interp.prng``'s numpy.
"""

from __future__ import annotations

import numpy as np

M32 = 0xFFFFFFFF


def taus88(s1: int, s2: int, s3: int) -> tuple[int, int, int]:
    """One step of the three component generators (32-bit words)."""
    b = (((s1 << 13) & M32) ^ s1) >> 19
    s1 = (((s1 & 4294967294) << 12) & M32) ^ b
    b = (((s2 << 2) & M32) ^ s2) >> 25
    s2 = (((s2 & 4294967288) << 4) & M32) ^ b
    b = (((s3 << 3) & M32) ^ s3) >> 11
    s3 = (((s3 & 4294967280) << 17) & M32) ^ b
    return s1, s2, s3


def reference(state: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(float32 values of ``shape``, the next state) drawn from ``state``."""
    streams = [tuple(int(state[k, t]) for k in range(3)) for t in range(2048)]
    n = int(np.prod(shape, dtype=np.int64))
    values = np.empty(n, np.float32)
    for i in range(n):
        t = i % 2048
        streams[t] = taus88(*streams[t])
        s1, s2, s3 = streams[t]
        values[i] = np.float32(s1 ^ s2 ^ s3) / np.float32(2.0**32)
    return values.reshape(shape), np.array(streams, np.uint32).T.copy()


def seed_state(seed: int) -> np.ndarray:
    """A state seeded as PlaidML's Keras backend did: components above 1, 7 and 15."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(lo, 2**32, 2048, dtype=np.uint32) for lo in (2, 8, 16)])
