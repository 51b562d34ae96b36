"""The helper functions generated code calls, as C text for a given target.

* ``tile_f2l`` / ``tile_d2l``: float / double -> int64 modulo 2**64, truncating toward zero; nan and
  ±inf give 0. Below 2**63 in magnitude the C conversion is exact; above, the value is
  ``mantissa << e`` with ``e >= 40``, so its residue modulo 2**64 is that shift done in uint64.
* ``tile_rh`` / ``tile_rhd``: float / double rounded once to the nearest float16 value.
* plain C only: ``tile_bits_f``/``tile_bits_d`` (IEEE bits), ``tile_h2f``/``tile_f2h`` (half bits
  <-> float in integer arithmetic, round to nearest even).
* ``tile_bf2f`` / ``tile_f2bf``: bfloat16 bits <-> float by bit shifts (round to nearest even, a nan
  stays a quiet nan); ``tile_rbf`` / ``tile_rbfd``: float / double rounded once to bfloat16 (the
  double through float rounded to odd).

A target may replace any of them with ``helper_text`` (OpenCL has ``vload_half``/``vstore_half_rte``).
"""

from __future__ import annotations

from backends.clike.target import CTarget
from tile.dtypes import DType

# definition order: a helper only calls those before it
ORDER = ("tile_bits_f", "tile_bits_d", "tile_h2f", "tile_f2h", "tile_rh", "tile_rhd", "tile_f2l", "tile_d2l")
ORDER += ("tile_f_of_bits", "tile_bf2f", "tile_f2bf", "tile_rbf", "tile_rbfd")


def _ftol(t: CTarget, double: bool) -> str:
    dt = DType.FLOAT64 if double else DType.FLOAT32
    i64, u64, u32 = t.TYPES[DType.INT64], t.TYPES[DType.UINT64], t.TYPES[DType.UINT32]
    us = t.INT_SUFFIX.get(DType.UINT64, "")
    ftype = t.TYPES[dt]
    name = "tile_d2l" if double else "tile_f2l"
    trunc = t.math("trunc", dt, ["x"])
    fabs = t.math("fabs", dt, ["v"])
    if double:
        bits_t, shift, mask, one, bias, top = u64, 52, (1 << 52) - 1, 1 << 52, 1075, "0x1p63"
    else:
        bits_t, shift, mask, one, bias, top = u32, 23, (1 << 23) - 1, 1 << 23, 150, "0x1p63f"
    exp_mask = 0x7FF if double else 0xFF
    sign = 63 if double else 31
    return "\n".join(
        [
            f"{t.function_qualifier}{i64} {name}({ftype} x)",
            "{",
            f"    {ftype} v = {trunc};",
            f"    if (!({fabs} < INFINITY)) return 0;",
            f"    if ({fabs} < {top}) return ({i64})v;",
            f"    {bits_t} b = {t.bits('v', dt)};",
            f"    int e = (int)((b >> {shift}) & {exp_mask}) - {bias};",
            f"    {u64} m = ({u64})((b & {mask:#x}{us}) | {one:#x}{us});",
            f"    {u64} r = e < 64 ? m << e : 0;",
            f"    return ({i64})((b >> {sign}) ? 0 - r : r);",
            "}",
        ]
    )


def _c_helper(t: CTarget, name: str) -> str:
    q = t.function_qualifier
    if name == "tile_bits_f":
        return f"{q}uint32_t tile_bits_f(float x) {{ uint32_t b; memcpy(&b, &x, 4); return b; }}"
    if name == "tile_f_of_bits":
        return f"{q}float tile_f_of_bits(uint32_t b) {{ float x; memcpy(&x, &b, 4); return x; }}"
    if name == "tile_bits_d":
        return f"{q}uint64_t tile_bits_d(double x) {{ uint64_t b; memcpy(&b, &x, 8); return b; }}"
    if name == "tile_h2f":
        return f"""{q}float tile_h2f(uint16_t h)
{{
    uint32_t x = h, sign = (x & 0x8000u) << 16, em = x & 0x7fffu, out;
    float sub = (float)em * 0x1p-24f;
    if (em >= 0x7c00u) out = 0x7f800000u | ((em & 0x3ffu) << 13);
    else if (em < 0x400u) memcpy(&out, &sub, 4);
    else out = (em << 13) + ((127u - 15u) << 23);
    out |= sign;
    float f; memcpy(&f, &out, 4); return f;
}}"""
    if name == "tile_f2h":
        return f"""{q}uint16_t tile_f2h(float f)
{{
    uint32_t x = tile_bits_f(f), sign = (x & 0x80000000u) >> 16, a = x & 0x7fffffffu, out;
    if (a >= 0x7f800000u) out = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : 0x7c00u;
    else if (a >= 0x477ff000u) out = 0x7c00u;
    else if (a < 0x38800000u) {{ float s; memcpy(&s, &a, 4); out = tile_bits_f(s + 0.5f) - 0x3f000000u; }}
    else out = (a + (((uint32_t)(15 - 127)) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    return (uint16_t)(out | sign);
}}"""
    if name == "tile_rh":
        return f"{q}float tile_rh(float x) {{ return tile_h2f(tile_f2h(x)); }}"
    if name == "tile_rhd":
        # double -> float rounded to odd, whose rounding to half is then the single correct one
        return f"""{q}float tile_rhd(double d)
{{
    float f = (float)d;
    if ((double)f != d && d == d) {{
        uint32_t b = tile_bits_f(f);
        if (fabs((double)f) > fabs(d)) b -= 1;
        b |= 1u;
        memcpy(&f, &b, 4);
    }}
    return tile_h2f(tile_f2h(f));
}}"""
    if name in BFLOAT_HELPERS:
        return bfloat_helper(t, name)
    raise KeyError(name)


BFLOAT_HELPERS = ("tile_bf2f", "tile_f2bf", "tile_rbf", "tile_rbfd")


def bfloat_helper(t: CTarget, name: str) -> str:
    """The bfloat16 helpers in the target's spelling of types and bit casts (``t.bits``,
    ``t.from_bits``): plain integer code, the same in C and OpenCL."""
    q, u16, u32 = t.function_qualifier, t.TYPES[DType.UINT16], t.TYPES[DType.UINT32]
    if name == "tile_bf2f":
        return f"{q}float tile_bf2f({u16} h) {{ return {t.float_of_bits(f'(({u32})h << 16)')}; }}"
    if name == "tile_f2bf":
        return "\n".join(
            [
                f"{q}{u16} tile_f2bf(float f)",
                "{",
                f"    {u32} x = {t.bits('f', DType.FLOAT32)};",
                f"    if ((x & 0x7fffffffu) > 0x7f800000u) return ({u16})((x >> 16) | 0x40u);",
                f"    return ({u16})((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);",
                "}",
            ]
        )
    if name == "tile_rbf":
        return f"{q}float tile_rbf(float x) {{ return tile_bf2f(tile_f2bf(x)); }}"
    # double -> float rounded to odd (truncate, set the last bit when inexact), then to bfloat16
    return "\n".join(
        [
            f"{q}float tile_rbfd(double d)",
            "{",
            "    float f = (float)d;",
            "    if ((double)f != d && d == d) {",
            f"        {u32} b = {t.bits('f', DType.FLOAT32)};",
            "        if (fabs((double)f) > fabs(d)) b -= 1;",
            "        b |= 1u;",
            f"        f = {t.float_of_bits('b')};",
            "    }",
            "    return tile_bf2f(tile_f2bf(f));",
            "}",
        ]
    )


def helper_source(t: CTarget) -> list[str]:
    """Definitions of every helper in ``t.helpers`` and of those they call, in dependency order."""
    texts: dict[str, str] = {}
    while set(t.helpers) - set(texts):
        for name in sorted(set(t.helpers) - set(texts)):
            if name in ("tile_f2l", "tile_d2l"):
                texts[name] = _ftol(t, name == "tile_d2l")
            else:
                texts[name] = t.helper_text(name) or _c_helper(t, name)
            if name in ("tile_f2h", "tile_rhd") and t.helper_text(name) is None:
                t.helpers.add("tile_bits_f")
            if name in ("tile_rh", "tile_rhd") and t.helper_text(name) is None:
                t.helpers |= {"tile_h2f", "tile_f2h"}
            if name in ("tile_rbf", "tile_rbfd"):
                t.helpers |= {"tile_bf2f", "tile_f2bf"}
    return [texts[n] for n in ORDER if n in texts]
