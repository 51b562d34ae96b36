"""The PRNG constants both code generators unroll (``backends.llvm.specials``, ``backends.clike.specials``).

taus88, L'Ecuyer's three-component Tausworthe generator, as ``ref_interp.prng`` defines
``prng_step``: per component ``(mask, mask shift left, feedback shift left, shift right)``, one
step being ``s = ((s & mask) << a) ^ (((s << c) ^ s) >> r)`` in 32-bit arithmetic.
"""

TAUS88 = ((0xFFFFFFFE, 12, 13, 19), (0xFFFFFFF8, 4, 2, 25), (0xFFFFFFF0, 17, 3, 11))

__all__ = ["TAUS88"]
