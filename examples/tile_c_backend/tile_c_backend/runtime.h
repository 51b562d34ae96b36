/* tile_c_backend's runtime: the helpers every generated source starts with (pasted in, so the
 * cache key covers them). Semantics: docs/semantics.md of Tile. Built with -fwrapv, so signed
 * integer arithmetic wraps, and -ffp-contract=off, so a*b+c rounds twice as the interpreter. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __FLT16_MAX__
/* float16: stored as _Float16, computed in float; every result is rounded back to float16 */
static inline float tile_h(double x) { return (float)(_Float16)x; }
#endif

/* float -> integer: truncate toward zero, wrap modulo 2**64 (a narrower cast then wraps modulo
 * its own width); nan and +-inf give 0. fmod is exact, and so is folding into [-2**63, 2**63). */
static inline int64_t tile_f2i(double x) {
    if (!isfinite(x)) return 0;
    double m = fmod(trunc(x), 18446744073709551616.0);
    if (m >= 9223372036854775808.0) m -= 18446744073709551616.0;
    if (m < -9223372036854775808.0) m += 18446744073709551616.0;
    return (int64_t)m;
}

/* integer / and mod: truncating, x / 0 == x mod 0 == 0, INT_MIN / -1 wraps, INT_MIN mod -1 == 0 */
#define TILE_INT(T, N, SIGNED)                                                        \
    static inline T tile_div_##N(T a, T b) {                                          \
        if (b == 0) return 0;                                                         \
        if (SIGNED && b == (T)-1) return (T)(0 - (uint64_t)a);                        \
        return (T)(a / b);                                                            \
    }                                                                                 \
    static inline T tile_mod_##N(T a, T b) {                                          \
        if (b == 0 || (SIGNED && b == (T)-1)) return 0;                               \
        return (T)(a % b);                                                            \
    }
TILE_INT(int8_t, i8, 1)
TILE_INT(int16_t, i16, 1)
TILE_INT(int32_t, i32, 1)
TILE_INT(int64_t, i64, 1)
TILE_INT(uint8_t, u8, 0)
TILE_INT(uint16_t, u16, 0)
TILE_INT(uint32_t, u32, 0)
TILE_INT(uint64_t, u64, 0)

/* float max / min as numpy: nan propagates (the first's when both are), of two equal values the
 * second (max(-0.0, 0.0) is 0.0) */
#define TILE_FLOAT(T, N)                                                              \
    static inline T tile_max_##N(T a, T b) { return a != a ? a : b != b ? b : a > b ? a : b; } \
    static inline T tile_min_##N(T a, T b) { return a != a ? a : b != b ? b : a < b ? a : b; }
TILE_FLOAT(float, f32)
TILE_FLOAT(double, f64)

/* float rounded to TF32 (10 stored mantissa bits): half a TF32 ulp added to the magnitude's bits and
 * the low 13 bits dropped, so to nearest with ties away from zero; nan and inf are kept */
static inline float tile_round_tf32(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7f800000u) == 0x7f800000u) return x;
    b = (b + 0x1000u) & 0xffffe000u;
    memcpy(&x, &b, 4);
    return x;
}

/* one taus88 step of the stream whose three words are s[0], s[2048], s[4096]; the raw draw */
static inline uint32_t tile_taus88(uint32_t *s) {
    uint32_t a = s[0], b = s[2048], c = s[4096];
    a = ((a & 0xFFFFFFFEu) << 12) ^ (((a << 13) ^ a) >> 19);
    b = ((b & 0xFFFFFFF8u) << 4) ^ (((b << 2) ^ b) >> 25);
    c = ((c & 0xFFFFFFF0u) << 17) ^ (((c << 3) ^ c) >> 11);
    s[0] = a, s[2048] = b, s[4096] = c;
    return a ^ b ^ c;
}
