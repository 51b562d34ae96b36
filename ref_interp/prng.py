"""PlaidML's random number generator in numpy: the meaning of ``prng_step``/``prng_value``/``prng_state``.

The state is uint32 ``[3, 2048]``: column ``t`` holds the three components ``(s1, s2, s3)`` of
stream ``t``. A draw of ``n`` elements (row-major) takes element ``i`` from stream ``i mod 2048``:
the stream first advances by one step of L'Ecuyer's three-component Tausworthe generator taus88
(with 32-bit wrap-around)::

    s1 = ((s1 & 0xFFFFFFFE) << 12) ^ (((s1 << 13) ^ s1) >> 19)
    s2 = ((s2 & 0xFFFFFFF8) <<  4) ^ (((s2 <<  2) ^ s2) >> 25)
    s3 = ((s3 & 0xFFFFFFF0) << 17) ^ (((s3 <<  3) ^ s3) >> 11)

and the element's raw draw is ``s1 ^ s2 ^ s3``. So stream ``t`` advances ``ceil((n - t) / 2048)``
times (not at all when ``t >= n``), and the next state is every stream after its advances. The
value is ``float32(raw) * 2**-32``: the conversion rounds to nearest, so it lies in [0, 1] (1.0
for raws of at least 2**32 - 128). This is ``tile/lang/gen_special.cc``'s OpenCL kernel in
PlaidML 0.7; every executor here computes exactly these bits.
"""

from __future__ import annotations

import numpy as np

from ref_interp.numerics import Numerics
from tile.prng import SCALE as _SCALE
from tile.prng import STREAMS, TAUS88
from tile.typed import TCall

_MASKS = tuple(np.uint32(mask) for mask, *_ in TAUS88)
_SHIFTS = tuple(shifts for _, *shifts in TAUS88)  # (mask shift left, feedback shift left, right)
SCALE = np.float32(_SCALE)


def advance(s: np.ndarray) -> np.ndarray:
    """One taus88 step of every column of ``s`` (uint32, rows s1, s2, s3)."""
    out = np.empty_like(s)
    for k, (mask, (a, b, c)) in enumerate(zip(_MASKS, _SHIFTS)):
        x = s[k]
        out[k] = ((x & mask) << np.uint32(a)) ^ (((x << np.uint32(b)) ^ x) >> np.uint32(c))
    return out


def draw(state: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` raw uint32 draws from ``state`` (uint32 [3, 2048]) and the state after them."""
    s = np.array(state, dtype=np.uint32).reshape(3, STREAMS)
    raw = np.empty(n, dtype=np.uint32)
    for start in range(0, n, STREAMS):
        m = min(STREAMS, n - start)
        s[:, :m] = advance(s[:, :m])
        raw[start : start + m] = s[0, :m] ^ s[1, :m] ^ s[2, :m]
    return raw, s


def value(raw: np.ndarray) -> np.ndarray:
    """The float32 in [0, 1] of each raw draw (a single rounding, then an exact scaling)."""
    return np.asarray(raw, dtype=np.uint32).astype(np.float32) * SCALE


def _count(call: TCall) -> int:
    return int(np.prod(call.params, dtype=np.int64))


def _step(nx: Numerics, call: TCall, args: list[np.ndarray]) -> np.ndarray:
    return draw(args[0], _count(call))[0].reshape(call.type.shape)


def _value(nx: Numerics, call: TCall, args: list[np.ndarray]) -> np.ndarray:
    return value(args[0])


def _state(nx: Numerics, call: TCall, args: list[np.ndarray]) -> np.ndarray:
    return draw(args[0], _count(call))[1]


# The interpreter's implementations, by builtin name (``ref_interp.elementwise`` takes them in).
IMPLS = {"prng_step": _step, "prng_value": _value, "prng_state": _state}
