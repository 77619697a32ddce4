"""The C helpers every generated kernel starts with.

Each helper pins down one semantic detail of the reference (numpy / ONNX Runtime) that
plain C gets wrong or leaves undefined: floor division and modulo on negative ints,
division by zero and INT_MIN / -1 (numpy gives 0 and wraps; C traps), NaN-propagating
max/min, numpy's float modulo, bfloat16 round-to-nearest-even, an overflow-safe
sigmoid. Every helper is ``static inline`` and pure, so kernels keep no global state.

``INDEX_PRELUDE`` follows it in kernels that check indices read at run time: ``tf_index``
records an index out of range in the status word the kernel was handed (an argument:
runs in flight never share it). Other kernels' text stays as it was without it.

One exported helper is for the runtime, not the kernel: ``tf_run_steps`` calls a run of
kernels in order, so a plan's consecutive kernel steps cost one ctypes call, not one each.
Every kernel library carries it; the runtime uses the copy in the first library it loads.
"""

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- half floats: values live in float, rounded once per operation ------------------ */
static inline float tf_round_f16(float x) { return (float)(_Float16)x; }
static inline float tf_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t tf_f32_to_bf16(float f) {  /* round to nearest even, NaN stays NaN */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float tf_round_bf16(float x) { return tf_bf16_to_f32(tf_f32_to_bf16(x)); }

/* -- integers: numpy semantics, no traps -------------------------------------------- */
static inline int64_t tf_neg_i64(int64_t a) { return (int64_t)(0 - (uint64_t)a); }
static inline int64_t tf_floordiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return tf_neg_i64(a);
    int64_t q = a / b;
    return q - ((a % b != 0) && ((a < 0) != (b < 0)));
}
static inline int64_t tf_floormod(int64_t a, int64_t b) {  /* sign of the divisor */
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t tf_div_i64(int64_t a, int64_t b) {  /* truncates toward zero */
    if (b == 0) return 0;
    return b == -1 ? tf_neg_i64(a) : a / b;
}
static inline uint64_t tf_div_u64(uint64_t a, uint64_t b) { return b ? a / b : 0; }
static inline int64_t tf_fmod_i64(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline uint64_t tf_mod_u64(uint64_t a, uint64_t b) { return b ? a % b : 0; }
static inline int64_t tf_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t tf_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline uint64_t tf_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static inline uint64_t tf_max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }
static inline int64_t tf_abs_i64(int64_t a) { return a < 0 ? tf_neg_i64(a) : a; }
static inline int64_t tf_sign_i64(int64_t a) { return (a > 0) - (a < 0); }
static inline uint64_t tf_shl_u64(uint64_t a, uint64_t b, unsigned bits) { return b < bits ? a << b : 0; }
static inline int64_t tf_shr_i64(int64_t a, uint64_t b, unsigned bits) {
    return b < bits ? a >> b : (a < 0 ? -1 : 0);
}
static inline uint64_t tf_shr_u64(uint64_t a, uint64_t b, unsigned bits) { return b < bits ? a >> b : 0; }
static inline int64_t tf_pow_i64(int64_t a, int64_t b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    uint64_t r = 1, x = (uint64_t)a;
    while (b) { if (b & 1) r *= x; x *= x; b >>= 1; }
    return (int64_t)r;
}

/* -- floats: NaN-propagating max/min, numpy's modulo, sign, sigmoid ----------------- */
/* max/min where b is never NaN (a constant: ReLU's 0, Clip's bounds): one compare and one
 * select a lane. Ties give b (numpy's zero: maximum(0., -0.) is -0.), a NaN a gives a. */
static inline float tf_maxk_f32(float a, float b) { return b >= a ? b : a; }
static inline float tf_mink_f32(float a, float b) { return b <= a ? b : a; }
static inline double tf_maxk_f64(double a, double b) { return b >= a ? b : a; }
static inline double tf_mink_f64(double a, double b) { return b <= a ? b : a; }
/* and where a is never NaN */
static inline float tf_kmax_f32(float a, float b) { return a > b ? a : b; }
static inline float tf_kmin_f32(float a, float b) { return a < b ? a : b; }
static inline double tf_kmax_f64(double a, double b) { return a > b ? a : b; }
static inline double tf_kmin_f64(double a, double b) { return a < b ? a : b; }
/* the general forms: the above, then b where b is NaN. Each select tests one operand of the
 * call, never the NaN-ness of a select's result, which GCC would thread through a chain of
 * them (max over a window's taps) into a select of masks it cannot vectorise; and the
 * scalar remainder of a vector loop takes no branch (the `a > b || a != a` form branched
 * twice an element: a 3 x 3 max pool 2.6x slower). The first select is computed before
 * the second, not nested in it: nested, GCC merges the two conditions and branches again */
static inline float tf_max_f32(float a, float b) { float m = b >= a ? b : a; return b != b ? b : m; }
static inline float tf_min_f32(float a, float b) { float m = b <= a ? b : a; return b != b ? b : m; }
static inline double tf_max_f64(double a, double b) { double m = b >= a ? b : a; return b != b ? b : m; }
static inline double tf_min_f64(double a, double b) { double m = b <= a ? b : a; return b != b ? b : m; }
static inline float tf_sign_f32(float x) { return x > 0 ? 1.0f : (x < 0 ? -1.0f : (x == 0 ? 0.0f : x)); }
static inline double tf_sign_f64(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : (x == 0 ? 0.0 : x)); }
static inline float tf_mod_f32(float a, float b) {  /* sign of the divisor, like numpy */
    float m = fmodf(a, b);
    if (b == 0) return m;
    if (m != 0) return ((b < 0) != (m < 0)) ? m + b : m;
    return copysignf(0.0f, b);
}
static inline double tf_mod_f64(double a, double b) {
    double m = fmod(a, b);
    if (b == 0) return m;
    if (m != 0) return ((b < 0) != (m < 0)) ? m + b : m;
    return copysign(0.0, b);
}

/* -- float exp, tanh and erf without branches, so that loops of them vectorise --------------
 * libm's expf/tanhf are calls the compiler cannot vectorise (without -ffast-math). These
 * are Cephes' single-precision methods for exp and tanh and a fit of our own for erf
 * (within 2.5 ulp of the correctly rounded result over the whole range), written with
 * selects, with IEEE special cases kept: NaN stays NaN,
 * exp(-inf) = 0, exp(inf) = inf, results below FLT_MIN are subnormal, tanh(-0) = -0. */
static inline float tf_bits_f32(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline int32_t tf_f32_bits(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
/* exp's reduction and polynomial: p with e^x = 2^n * p, n returned through ``n``; x must be
 * clamped to where 2^n can be formed (NaN's bits give any n: the caller keeps NaN) */
static inline float tf_exp_poly_f32(float x, uint32_t *n) {
    float k = x * 1.44269504088896341f + 12582912.0f;  /* + 1.5 * 2^23 rounds to an integer n */
    *n = (uint32_t)tf_f32_bits(k) - 0x4B400000u;  /* (no float-to-int conversion: it would not vectorise) */
    float fn = k - 12582912.0f;
    float r = x - fn * 0.693359375f;  /* ln 2 in two parts: the first exact in n * it */
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}
static inline float tf_exp_f32(float x) {
    float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);  /* beyond: 0 and inf anyway */
    uint32_t un;
    float p = tf_exp_poly_f32(xc, &un);
    int32_t n = (int32_t)un, h = n >> 1;  /* 2^n as 2^h * 2^(n-h): both normal for n in [-150, 128] */
    float y = p * tf_bits_f32((h + 127) << 23) * tf_bits_f32((n - h + 127) << 23);
    return x != x ? x : y;
}
/* p * 2^(n + bias - 127) in one power: for callers whose argument keeps that power normal
 * (bias 127: x in [-87, 88]) or is NaN (then so is the result): tanh's and erf's, whose own
 * selects keep the special values, and sigmoid's e^x for x in [-104, 0] with bias 191 (then
 * scaled by 2^-64). No clamps, no split power, no NaN select: a third of tanh's and erf's
 * time. */
static inline float tf_exp_core_f32(float x, uint32_t bias) {
    uint32_t n;
    float p = tf_exp_poly_f32(x, &n);
    return p * tf_bits_f32((int32_t)((n + bias) << 23));
}
static inline float tf_tanh_f32(float x) {
    float ax = fabsf(x);
    float e = tf_exp_core_f32(2.0f * (ax > 20.0f ? 20.0f : ax), 127u);  /* tanh(20) is 1 in float */
    float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                   + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    return ax > 0.625f ? big : copysignf(small, x);  /* NaN: the small form, which keeps it */
}
static inline float tf_erf_f32(float x) {
    /* |x| < 1: x S(x^2); beyond: 1 - erfc, erfc = exp(G(|x|) - x^2). S and G are degree-6
     * weighted minimax fits made by tools/fit_erf.py (S: erf(x)/x on [0, 1], relative error
     * 1.2e-9; G: log erfc(x) + x^2 on [1, 3.92], 0.02 ulp of erf; erf rounds to +-1 beyond
     * 3.92). Within 2.5 ulp in float; no division, one exp: half the time of the rational
     * erfc in double it replaces, in the loops that vectorise it. */
    float ax = fabsf(x), z = x * x;
    float s = 7.853811257518828e-05f;
    s = s * z - 0.0008010179735720158f;
    s = s * z + 0.005188326351344585f;
    s = s * z - 0.026853810995817184f;
    s = s * z + 0.1128358542919159f;
    s = s * z - 0.3761262595653534f;
    s = s * z + 1.1283791065216064f;
    float small = x * s;
    float a = ax > 3.92f ? 3.92f : ax, u = a - 2.46f;
    float g = 0.00018557572911959141f;
    g = g * u - 0.00020052710897289217f;
    g = g * u + 0.002493456704542041f;
    g = g * u - 0.011113733984529972f;
    g = g * u + 0.05742445960640907f;
    g = g * u - 0.35723522305488586f;
    g = g * u - 1.5426195859909058f;
    float big = copysignf(1.0f - tf_exp_core_f32(g - a * a, 127u), x);  /* g - a^2 in [-17, -1] */
    return ax < 1.0f ? small : big;  /* NaN: NaN either way; +-inf: the big form's +-1 */
}
static inline float tf_sigmoid_f32(float x) {  /* never overflows: exp of a non-positive */
    float a = -fabsf(x);
    /* e^a for a in [-104, 0]: 2^n * p as (2^(n + 64) * p) * 2^-64, the first product exact
     * and normal, the second rounding once into the subnormals where it must */
    float e = tf_exp_core_f32(a < -104.0f ? -104.0f : a, 191u) * 5.42101086242752217e-20f;
    float r = 1.0f / (1.0f + e);
    return x >= 0 ? r : e * r;
}
static inline double tf_sigmoid_f64(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* -- AVX2's masks (vmaskmovps): the first w of 8 lanes, for the helpers' last columns -- */
#if !defined(__AVX512F__) && defined(__AVX2__)
#include <immintrin.h>
static inline __m256i tf_first8(int64_t w) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* -- tile buffers too big for the stack: 64-byte aligned; zeroed, or not (a tile whose
 * first use writes all of it: codegen/cpu/first_products.py) ---------------------------- */
static void *tf_alloc_raw(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) { fputs("tilefuse kernel: out of memory for a tile buffer\n", stderr); abort(); }
    return p;
}
static void *tf_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = tf_alloc_raw(bytes);
    memset(p, 0, n ? n : 64);
    return p;
}

/* -- the product core: register-blocked c += a @ b on fp32 tiles -------------------- */
/* Blocks of MR rows x 8*NV columns of c stay in vector registers over the whole k loop:
 * each step loads NV vectors of b's row and broadcasts MR values of a. Sums run over k
 * in order, element by element, exactly as the plain i-k-j loop adds them. With ``zero``
 * the accumulators start at 0 instead of c's values: c = a @ b, bit for bit what zeroing
 * c first would give (0 + x is x), without the zeroing pass or the loads of c. */
typedef float tf_v8 __attribute__((vector_size(32), aligned(4)));
/* MR rows x NV vectors of W floats (vector type VT) */
#define TF_MICRO_V(NAME, VT, W, MR, NV)                                                         \
static inline __attribute__((always_inline)) void NAME(int64_t k, const float *restrict a,     \
        int64_t lda, const float *restrict b, int64_t ldb, float *restrict c, int64_t ldc,      \
        int zero) {                                                                             \
    VT acc[MR][NV];                                                                             \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                    \
            acc[r][v] = zero ? (VT){0} : *(const VT *)(c + r * ldc + W * v);                    \
    for (int64_t p = 0; p < k; ++p) {                                                           \
        VT bv[NV];                                                                              \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) bv[v] = *(const VT *)(b + p * ldb + W * v); \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                 \
            const float ar = a[r * lda + p];                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];       \
        }                                                                                       \
    }                                                                                           \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                    \
            *(VT *)(c + r * ldc + W * v) = acc[r][v];                                           \
}
#define TF_MICRO(NAME, MR, NV) TF_MICRO_V(NAME, tf_v8, 8, MR, NV)
TF_MICRO(tf_micro_6x16, 6, 2)
TF_MICRO(tf_micro_5x16, 5, 2)
TF_MICRO(tf_micro_4x16, 4, 2)
TF_MICRO(tf_micro_3x16, 3, 2)
TF_MICRO(tf_micro_2x16, 2, 2)
TF_MICRO(tf_micro_1x16, 1, 2)
TF_MICRO(tf_micro_8x8, 8, 1)
TF_MICRO(tf_micro_4x8, 4, 1)
TF_MICRO(tf_micro_1x8, 1, 1)

/* rows [0, m) of a 16-column strip: blocks of 6, and the last 7..11 rows as two near-equal
 * blocks (8 rows as 4 + 4, not 6 + 2: a 2-row block is bound by its loads of b) */
static inline __attribute__((always_inline)) void tf_strip_16(int64_t m, int64_t k,
        const float *restrict a, int64_t lda, const float *restrict b, int64_t ldb,
        float *restrict c, int64_t ldc, int zero) {
    int64_t i = 0;
    while (m - i > 0) {
        int64_t left = m - i, r = left >= 12 ? 6 : (left > 6 ? (left + 1) / 2 : left);
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        switch (r) {
        case 6: tf_micro_6x16(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 5: tf_micro_5x16(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 4: tf_micro_4x16(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 3: tf_micro_3x16(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 2: tf_micro_2x16(k, ai, lda, b, ldb, ci, ldc, zero); break;
        default: tf_micro_1x16(k, ai, lda, b, ldb, ci, ldc, zero); break;
        }
        i += r;
    }
}

/* 16-float registers (AVX-512): blocks of MR rows x 32 columns, two vectors a row */
#ifdef __AVX512F__
#include <immintrin.h>
typedef float tf_v16 __attribute__((vector_size(64), aligned(4)));
#define TF_MICRO32(NAME, MR) TF_MICRO_V(NAME, tf_v16, 16, MR, 2)
TF_MICRO32(tf_micro32_12, 12) TF_MICRO32(tf_micro32_11, 11) TF_MICRO32(tf_micro32_10, 10) TF_MICRO32(tf_micro32_9, 9)
TF_MICRO32(tf_micro32_8, 8) TF_MICRO32(tf_micro32_7, 7) TF_MICRO32(tf_micro32_6, 6) TF_MICRO32(tf_micro32_5, 5)
TF_MICRO32(tf_micro32_4, 4) TF_MICRO32(tf_micro32_3, 3) TF_MICRO32(tf_micro32_2, 2) TF_MICRO32(tf_micro32_1, 1)

/* rows [0, m) of a 32-column strip of b (rows ldb apart: a panel's 32, or a tile's row):
 * blocks of 12 rows (24 accumulators of 16 floats), the last 13..23 rows as two near-equal
 * blocks */
static inline __attribute__((always_inline)) void tf_strip_32(int64_t m, int64_t k,
        const float *restrict a, int64_t lda, const float *restrict b, int64_t ldb,
        float *restrict c, int64_t ldc, int zero) {
    int64_t i = 0;
    while (m - i > 0) {
        const int64_t left = m - i, r = left >= 24 ? 12 : (left > 12 ? (left + 1) / 2 : left);
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        switch (r) {
        case 12: tf_micro32_12(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 11: tf_micro32_11(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 10: tf_micro32_10(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 9: tf_micro32_9(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 8: tf_micro32_8(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 7: tf_micro32_7(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 6: tf_micro32_6(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 5: tf_micro32_5(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 4: tf_micro32_4(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 3: tf_micro32_3(k, ai, lda, b, ldb, ci, ldc, zero); break;
        case 2: tf_micro32_2(k, ai, lda, b, ldb, ci, ldc, zero); break;
        default: tf_micro32_1(k, ai, lda, b, ldb, ci, ldc, zero); break;
        }
        i += r;
    }
}

/* rows [0, m) of one 16-column strip whose columns ``mask`` marks (the others are not
 * read nor written): blocks of 12 rows, one 16-float accumulator each */
#define TF_MASKED(NAME, MR)                                                                     \
static inline __attribute__((always_inline)) void NAME(int64_t k, const float *restrict a,     \
        int64_t lda, const float *restrict b, int64_t ldb, float *restrict c, int64_t ldc,      \
        __mmask16 mask, int zero) {                                                             \
    __m512 acc[MR];                                                                             \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        acc[r] = zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, c + r * ldc);         \
    for (int64_t p = 0; p < k; ++p) {                                                           \
        const __m512 bv = _mm512_maskz_loadu_ps(mask, b + p * ldb);                             \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                   \
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + p]), bv, acc[r]);               \
    }                                                                                           \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(c + r * ldc, mask, acc[r]); \
}
TF_MASKED(tf_masked_12, 12) TF_MASKED(tf_masked_8, 8) TF_MASKED(tf_masked_4, 4) TF_MASKED(tf_masked_1, 1)

static inline __attribute__((always_inline)) void tf_strip_masked(int64_t m, int64_t k,
        const float *restrict a, int64_t lda, const float *restrict b, int64_t ldb,
        float *restrict c, int64_t ldc, __mmask16 mask, int zero) {
    int64_t i = 0;
    for (; i + 12 <= m; i += 12) tf_masked_12(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, mask, zero);
    for (; i + 8 <= m; i += 8) tf_masked_8(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, mask, zero);
    for (; i + 4 <= m; i += 4) tf_masked_4(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, mask, zero);
    for (; i < m; ++i) tf_masked_1(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, mask, zero);
}

/* a 2-D block turned over, rows, cols <= 16 (d[j * ds + i] = s[i * ss + j]): sixteen
 * masked row loads, the 16 x 16 turned in registers (pairs of floats, then of doubles,
 * then 128-bit quarters twice), rows masked stores */
static inline void tf_transpose16_f32(const float *restrict s, int64_t ss, float *restrict d, int64_t ds,
                                      int64_t rows, int64_t cols) {
    const __mmask16 cm = (__mmask16)((1u << cols) - 1u), rm = (__mmask16)((1u << rows) - 1u);
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, s + i * ss) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
    for (int j = 0; j < 16; ++j)
        if (j < cols) _mm512_mask_storeu_ps(d + j * ds, rm, r[j]);
}
/* the last w <= 8 columns of c[m x w] += a @ b with rows in vector lanes: 16 rows of a
 * turned into columns a block of 256 k (at[p][r] = a[r][p]), then one 16-row vector a
 * column summed over k in order, b's value broadcast: each element's sum the strips' own,
 * bit for bit. A masked strip would broadcast every a value for those few columns and cost
 * what 16 columns cost (a 14 x 14 map's last 4 of 196 positions: a tenth of a 1 x 1
 * convolution's time) */
static inline __attribute__((always_inline)) void tf_tail_rows_w(int64_t m, int64_t k, const float *restrict a,
        int64_t lda, const float *restrict b, int64_t ldb, float *restrict c, int64_t ldc, int64_t w, int zero) {
    float at[256 * 16] __attribute__((aligned(64)));
    for (int64_t i = 0; i < m; i += 16) {
        const int64_t mr = m - i < 16 ? m - i : 16;
        const __mmask16 rows = (__mmask16)((1u << mr) - 1u);
        if (mr < 16) memset(at, 0, sizeof at);  /* the lanes past the rows: no stale values (nor subnormals) */
        __m512 acc[8];
        for (int64_t q = 0; q < w; ++q) {  /* column q of the 16 rows */
            float col[16] __attribute__((aligned(64)));
            for (int64_t r = 0; r < 16; ++r) col[r] = r < mr && !zero ? c[(i + r) * ldc + q] : 0.0f;
            acc[q] = _mm512_load_ps(col);
        }
        for (int64_t p0 = 0; p0 < k; p0 += 256) {
            const int64_t kc = k - p0 < 256 ? k - p0 : 256;
            for (int64_t p = 0; p < kc; p += 16)  /* (lanes past mr: zero, never stored) */
                tf_transpose16_f32(a + i * lda + p0 + p, lda, at + p * 16, 16, mr, kc - p < 16 ? kc - p : 16);
            for (int64_t p = 0; p < kc; ++p) {
                const __m512 av = _mm512_load_ps(at + p * 16);
                const float *bp = b + (p0 + p) * ldb;
                for (int64_t q = 0; q < w; ++q) acc[q] = _mm512_fmadd_ps(av, _mm512_set1_ps(bp[q]), acc[q]);
            }
        }
        for (int64_t q = 0; q < w; ++q) {
            float col[16] __attribute__((aligned(64)));
            _mm512_mask_store_ps(col, rows, acc[q]);
            for (int64_t r = 0; r < mr; ++r) c[(i + r) * ldc + q] = col[r];
        }
    }
}
/* (each width its own copy: the accumulators in registers) */
static void tf_tail_rows(int64_t m, int64_t k, const float *restrict a, int64_t lda, const float *restrict b,
        int64_t ldb, float *restrict c, int64_t ldc, int64_t w, int zero) {
    switch (w) {
    case 1: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 1, zero); break;
    case 2: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 2, zero); break;
    case 3: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 3, zero); break;
    case 4: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 4, zero); break;
    case 5: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 5, zero); break;
    case 6: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 6, zero); break;
    case 7: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 7, zero); break;
    default: tf_tail_rows_w(m, k, a, lda, b, ldb, c, ldc, 8, zero); break;
    }
}
#endif

/* c[m x n] += a[m x k] @ b[k x n], row-major with leading dimensions lda, ldb, ldc; with
 * ``zero``, c[m x n] = a @ b (c is not read) */
static inline __attribute__((always_inline)) void tf_gemm_f32(int64_t m, int64_t n, int64_t k,
        const float *restrict a, int64_t lda, const float *restrict b, int64_t ldb,
        float *restrict c, int64_t ldc, int zero) {
    int64_t j = 0;
    if (k <= 0) {  /* no product: c keeps its values, or is zero */
        if (zero) for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)(n > 0 ? n : 0) * sizeof(float));
        return;
    }
#ifdef __AVX512F__
    for (; j + 32 <= n; j += 32) tf_strip_32(m, k, a, lda, b + j, ldb, c + j, ldc, zero);
    for (; j < n; j += 16) {  /* the last n - j < 32 columns: 16-wide strips, the last one masked or by rows */
        const int64_t w = n - j < 16 ? n - j : 16;
        if (w <= 8) tf_tail_rows(m, k, a, lda, b + j, ldb, c + j, ldc, w, zero);
        else tf_strip_masked(m, k, a, lda, b + j, ldb, c + j, ldc, (__mmask16)((1u << w) - 1u), zero);
    }
    return;
#endif
    for (; j + 16 <= n; j += 16) tf_strip_16(m, k, a, lda, b + j, ldb, c + j, ldc, zero);
    for (; j + 8 <= n; j += 8) {
        int64_t i = 0;
        for (; i + 8 <= m; i += 8) tf_micro_8x8(k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, zero);
        for (; i + 4 <= m; i += 4) tf_micro_4x8(k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, zero);
        for (; i < m; ++i) tf_micro_1x8(k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, zero);
    }
    if (j < n) {  /* the last n - j < 8 columns: through zero-padded 8-wide copies of b and c */
        const int64_t w = n - j;
        float bt[256 * 8] __attribute__((aligned(32)));
        float ct[8 * 8] __attribute__((aligned(32)));
        for (int64_t p0 = 0; p0 < k; p0 += 256) {
            const int64_t kc = k - p0 < 256 ? k - p0 : 256;
            for (int64_t p = 0; p < kc; ++p)
                for (int64_t q = 0; q < 8; ++q) bt[p * 8 + q] = q < w ? b[(p0 + p) * ldb + j + q] : 0.0f;
            for (int64_t i0 = 0; i0 < m; i0 += 8) {
                const int64_t mr = m - i0 < 8 ? m - i0 : 8;
                for (int64_t i = 0; i < mr; ++i)
                    for (int64_t q = 0; q < 8; ++q) ct[i * 8 + q] = q < w && !(zero && p0 == 0) ? c[(i0 + i) * ldc + j + q] : 0.0f;
                if (mr == 8) tf_micro_8x8(kc, a + i0 * lda + p0, lda, bt, 8, ct, 8, 0);
                else for (int64_t i = 0; i < mr; ++i) tf_micro_1x8(kc, a + (i0 + i) * lda + p0, lda, bt, 8, ct + i * 8, 8, 0);
                for (int64_t i = 0; i < mr; ++i)
                    for (int64_t q = 0; q < w; ++q) c[(i0 + i) * ldc + j + q] = ct[i * 8 + q];
            }
        }
    }
}

/* -- the runtime's step driver: a run of kernel steps in one call from the host ------ */
void tf_run_steps(int64_t n, void (*const *fns)(void **), void **const *argvs) {
    for (int64_t i = 0; i < n; ++i) fns[i](argvs[i]);
}
"""

PANEL_PRELUDE = r"""
/* -- the product core by a packed weight (PanelGemm): c += a @ panels ------------------ */
/* A weight bound as panels of 32 columns, each [K][32] contiguous: a K step of a panel is
 * two 64-byte rows. Blocks of MR rows of c x one panel stay in registers over a block of
 * K; a's rows are read in place (one broadcast per row and step). Sums run over k in
 * order, element by element, exactly as the plain loop adds them; the layout and the
 * order do not depend on the instruction set, only the width of the registers does. */
/* rows [0, m) by one panel's block of K. Without AVX-512, the first 6 rows' pass over
 * the first 16 columns also prefetches ``next`` (nk K steps: the block the next call
 * reads) into the second-level cache, its lines spread over the pass 16 K steps at a
 * time (each stretch a call of the core, which adds in the same order: the same sums).
 * The hardware's prefetch alone left the 6 x 16 core at 80-85% of its rate on blocks
 * streamed from the last-level cache (bert-base's MLP, NOTES.md session 37). */
static inline void tf_panel_rows(int64_t m, int64_t k, const float *restrict a, int64_t lda,
        const float *restrict b, float *restrict c, int64_t ldc, int zero, const float *next, int64_t nk) {
#ifdef __AVX512F__
    (void)next; (void)nk;
    tf_strip_32(m, k, a, lda, b, 32, c, ldc, zero);
#else  /* 8-float registers: a panel as two 16-column strips of the plain product core */
    int64_t i = 0;
    if (next && m >= 12) {
        const int64_t stretches = (k + 15) / 16, lines = nk * 2;  /* a K step of a panel: two lines */
        for (int64_t t = 0; t < stretches; ++t) {
            for (int64_t l = t * lines / stretches; l < (t + 1) * lines / stretches; ++l)
                __builtin_prefetch(next + l * 16, 0, 1);
            const int64_t p = t * 16;
            tf_micro_6x16(k - p < 16 ? k - p : 16, a + p, lda, b + p * 32, 32, c, ldc, zero && t == 0);
        }
        i = 6;
    }
    tf_strip_16(m - i, k, a + i * lda, lda, b, 32, c + i * ldc, ldc, zero);
    tf_strip_16(m, k, a, lda, b + 16, 32, c + 16, ldc, zero);
#endif
}

/* c[m x n] += a[m x k] (rows lda apart) @ rows [k0, k0 + k) of the n / 32 panels at bp,
 * each of kp rows (those past kp are not read, nor a's columns there); K in blocks of kb.
 * With ``zero``: c[m x n] = that product (c is not read) */
static void tf_panel_gemm_f32(int64_t m, int64_t n, int64_t k, const float *restrict a, int64_t lda,
        const float *restrict bp, int64_t kp, int64_t k0, float *restrict c, int64_t ldc, int64_t kb, int zero) {
    if (k > kp - k0) k = kp - k0 > 0 ? kp - k0 : 0;
    if (k <= 0) {  /* no product: c keeps its values, or is zero */
        if (zero) for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)(n > 0 ? n : 0) * sizeof(float));
        return;
    }
    for (int64_t j = 0; j < n; j += 32) {
        const float *panel = bp + (j / 32) * kp * 32 + k0 * 32;
        for (int64_t p0 = 0; p0 < k; p0 += kb) {
            const int64_t kc = k - p0 < kb ? k - p0 : kb;
            /* the block after this one: this panel's next, or the next panel's first */
            const float *next = p0 + kc < k ? panel + (p0 + kc) * 32 : (j + 32 < n ? panel + kp * 32 : 0);
            const int64_t nk = p0 + kc < k ? (k - p0 - kc < kb ? k - p0 - kc : kb) : (k < kb ? k : kb);
            tf_panel_rows(m, kc, a + p0, lda, panel + p0 * 32, c + j, ldc, zero && p0 == 0, next, nk);
        }
    }
}
"""

ROW_BLOCKS_PRELUDE = r"""
/* -- the product core by a weight bound in row blocks (StridedGemm.a_blocks) ---------- */
/* A tile of m rows of A stored as the core's register blocks of it (tf_strip_32's rule:
 * blocks of 12 rows, the last 13 to 23 as two near-equal ones), block by block, each of
 * r rows as [kp][r]: a K step of a block is one run of r floats, and the whole tile one
 * stream, where rows as stored are r streams kp floats apart (a cold weight's rows
 * defeat the prefetcher: ResNet-50's 1024 -> 256 pointwise convolution took 1.2x as
 * long; benchmarks/NOTES.md, session 34). A block starting at row i of the tile lies
 * at i * kp, its K step p at p * r. Sums run over k in order, element by element, as
 * the core adds them on rows as stored: the same values, bit for bit. */
#define TF_BMICRO_V(NAME, VT, W, MR, NV)                                                       \
static inline __attribute__((always_inline)) void NAME(int64_t k, const float *restrict a,     \
        const float *restrict b, int64_t ldb, float *restrict c, int64_t ldc, int zero) {       \
    VT acc[MR][NV];                                                                             \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                    \
            acc[r][v] = zero ? (VT){0} : *(const VT *)(c + r * ldc + W * v);                    \
    for (int64_t p = 0; p < k; ++p) {                                                           \
        VT bv[NV];                                                                              \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) bv[v] = *(const VT *)(b + p * ldb + W * v); \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                 \
            const float ar = a[p * MR + r];                                                     \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];       \
        }                                                                                       \
    }                                                                                           \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                    \
            *(VT *)(c + r * ldc + W * v) = acc[r][v];                                           \
}
#ifdef __AVX512F__
#define TF_BMICRO32(MR) TF_BMICRO_V(tf_bmicro32_##MR, tf_v16, 16, MR, 2)
TF_BMICRO32(12) TF_BMICRO32(11) TF_BMICRO32(10) TF_BMICRO32(9) TF_BMICRO32(8) TF_BMICRO32(7)
TF_BMICRO32(6) TF_BMICRO32(5) TF_BMICRO32(4) TF_BMICRO32(3) TF_BMICRO32(2) TF_BMICRO32(1)

/* one block of r rows (a: its K step 0) by one 32-column strip */
static inline void tf_block_strip_32(int64_t r, int64_t k, const float *restrict a, const float *restrict b,
        int64_t ldb, float *restrict c, int64_t ldc, int zero) {
    switch (r) {
    case 12: tf_bmicro32_12(k, a, b, ldb, c, ldc, zero); break;
    case 11: tf_bmicro32_11(k, a, b, ldb, c, ldc, zero); break;
    case 10: tf_bmicro32_10(k, a, b, ldb, c, ldc, zero); break;
    case 9: tf_bmicro32_9(k, a, b, ldb, c, ldc, zero); break;
    case 8: tf_bmicro32_8(k, a, b, ldb, c, ldc, zero); break;
    case 7: tf_bmicro32_7(k, a, b, ldb, c, ldc, zero); break;
    case 6: tf_bmicro32_6(k, a, b, ldb, c, ldc, zero); break;
    case 5: tf_bmicro32_5(k, a, b, ldb, c, ldc, zero); break;
    case 4: tf_bmicro32_4(k, a, b, ldb, c, ldc, zero); break;
    case 3: tf_bmicro32_3(k, a, b, ldb, c, ldc, zero); break;
    case 2: tf_bmicro32_2(k, a, b, ldb, c, ldc, zero); break;
    default: tf_bmicro32_1(k, a, b, ldb, c, ldc, zero); break;
    }
}

/* one block of r <= 12 rows by the last w < 32 columns, 16 at a time: one vector of the
 * block's rows (its K step, one masked load) per column, b's value broadcast, as
 * tf_tail_rows sums them */
static inline void tf_block_tail(int64_t r, int64_t k, const float *restrict a, const float *restrict b,
        int64_t ldb, float *restrict c, int64_t ldc, int64_t w, int zero) {
    const __mmask16 rows = (__mmask16)((1u << r) - 1u);
    for (int64_t j = 0; j < w; j += 8) {
        const int64_t cols = w - j < 8 ? w - j : 8;
        __m512 acc[8];
        for (int64_t q = 0; q < cols; ++q) {
            float col[16] __attribute__((aligned(64))) = {0};
            for (int64_t i = 0; i < r && !zero; ++i) col[i] = c[i * ldc + j + q];
            acc[q] = _mm512_load_ps(col);
        }
        for (int64_t p = 0; p < k; ++p) {
            const __m512 av = _mm512_maskz_loadu_ps(rows, a + p * r);
            const float *bp = b + p * ldb + j;
            for (int64_t q = 0; q < cols; ++q) acc[q] = _mm512_fmadd_ps(av, _mm512_set1_ps(bp[q]), acc[q]);
        }
        for (int64_t q = 0; q < cols; ++q) {
            float col[16] __attribute__((aligned(64)));
            _mm512_store_ps(col, acc[q]);
            for (int64_t i = 0; i < r; ++i) c[i * ldc + j + q] = col[i];
        }
    }
}
#endif

/* c[m x n] += rows [k0, k0 + k) of A's tile of m rows in row blocks at a (each block kp
 * long) @ b[k x n] (rows ldb apart); with ``zero``, c = that product (c is not read) */
static void tf_gemm_blocks_f32(int64_t m, int64_t n, int64_t k, const float *restrict a, int64_t kp, int64_t k0,
        const float *restrict b, int64_t ldb, float *restrict c, int64_t ldc, int zero) {
    if (k <= 0) {
        if (zero) for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)(n > 0 ? n : 0) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < m;) {
        const int64_t left = m - i, r = left >= 24 ? 12 : (left > 12 ? (left + 1) / 2 : left);
        const float *ab = a + i * kp + k0 * r;
        float *ci = c + i * ldc;
#ifdef __AVX512F__
        int64_t j = 0;
        for (; j + 32 <= n; j += 32) tf_block_strip_32(r, k, ab, b + j, ldb, ci + j, ldc, zero);
        if (j < n) tf_block_tail(r, k, ab, b + j, ldb, ci + j, ldc, n - j, zero);
#else  /* a block turned back into rows, 256 K steps at a time, by the plain core */
        float at[12 * 256] __attribute__((aligned(64)));
        for (int64_t p0 = 0; p0 < k; p0 += 256) {
            const int64_t kc = k - p0 < 256 ? k - p0 : 256;
            for (int64_t p = 0; p < kc; ++p)
                for (int64_t q = 0; q < r; ++q) at[q * kc + p] = ab[(p0 + p) * r + q];
            tf_gemm_f32(r, n, kc, at, kc, b + p0 * ldb, ldb, ci, ldc, zero && p0 == 0);
        }
#endif
        i += r;
    }
}
"""

INT8_PANEL_PRELUDE = r"""
/* -- the integer product core (PanelGemm of int8 panels): c += a @ panels, exactly ----- */
/* uint8 rows of a by a weight of int8 values bound as panels of 32 columns in groups of 4
 * K rows: a group of a panel is [32][4] contiguous (128 bytes), one 32-bit lane holding a
 * column's 4 consecutive K values, as one VNNI step (vpdpbusd: four u8 x s8 products added
 * into an int32 lane) takes them. Sums are exact in int32 (no saturation: K * 255 * 128
 * stays below 2^31 for K < 65793), so their order does not matter. */
static inline int32_t tf_u8x4(const uint8_t *a, int64_t left) {  /* 4 bytes of a row, zeros past it */
    uint8_t t[4] = {0, 0, 0, 0};
    memcpy(t, a, left >= 4 ? 4 : (size_t)left);
    int32_t v;
    memcpy(&v, t, 4);
    return v;
}
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
/* MR rows x one panel (two 16-lane int32 accumulators a row) over k values of K */
#define TF_QMICRO(NAME, MR)                                                                     \
static inline __attribute__((always_inline)) void NAME(int64_t k, const uint8_t *restrict a,   \
        int64_t lda, const int8_t *restrict b, int32_t *restrict c, int64_t ldc) {              \
    __m512i acc0[MR], acc1[MR];                                                                 \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                     \
        acc0[r] = _mm512_loadu_si512(c + r * ldc); acc1[r] = _mm512_loadu_si512(c + r * ldc + 16); } \
    const int64_t whole = k / 4;                                                                \
    for (int64_t g = 0; g <= whole; ++g) {                                                      \
        if (g == whole && k % 4 == 0) break;                                                    \
        const __m512i b0 = _mm512_loadu_si512(b + g * 128), b1 = _mm512_loadu_si512(b + g * 128 + 64); \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                 \
            int32_t q;                                                                          \
            if (g < whole) memcpy(&q, a + r * lda + g * 4, 4); else q = tf_u8x4(a + r * lda + g * 4, k % 4); \
            const __m512i av = _mm512_set1_epi32(q);                                            \
            acc0[r] = _mm512_dpbusd_epi32(acc0[r], av, b0);                                     \
            acc1[r] = _mm512_dpbusd_epi32(acc1[r], av, b1);                                     \
        }                                                                                       \
    }                                                                                           \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                     \
        _mm512_storeu_si512(c + r * ldc, acc0[r]); _mm512_storeu_si512(c + r * ldc + 16, acc1[r]); } \
}
TF_QMICRO(tf_qmicro_12, 12) TF_QMICRO(tf_qmicro_11, 11) TF_QMICRO(tf_qmicro_10, 10) TF_QMICRO(tf_qmicro_9, 9)
TF_QMICRO(tf_qmicro_8, 8) TF_QMICRO(tf_qmicro_7, 7) TF_QMICRO(tf_qmicro_6, 6) TF_QMICRO(tf_qmicro_5, 5)
TF_QMICRO(tf_qmicro_4, 4) TF_QMICRO(tf_qmicro_3, 3) TF_QMICRO(tf_qmicro_2, 2) TF_QMICRO(tf_qmicro_1, 1)
#endif

/* rows [0, m) by one panel's block of k values of K: with VNNI blocks of 12 rows (the last
 * 13..23 as two near-equal blocks, as the float core); without it a plain loop of int32
 * sums (a kernel built without VNNI is given int16 panels: tf_panel_gemm_u8s16) */
static inline void tf_qpanel_rows(int64_t m, int64_t k, const uint8_t *restrict a, int64_t lda,
        const int8_t *restrict b, int32_t *restrict c, int64_t ldc) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    int64_t i = 0;
    while (m - i > 0) {
        const int64_t left = m - i, r = left >= 24 ? 12 : (left > 12 ? (left + 1) / 2 : left);
        const uint8_t *ai = a + i * lda;
        int32_t *ci = c + i * ldc;
        switch (r) {
        case 12: tf_qmicro_12(k, ai, lda, b, ci, ldc); break;
        case 11: tf_qmicro_11(k, ai, lda, b, ci, ldc); break;
        case 10: tf_qmicro_10(k, ai, lda, b, ci, ldc); break;
        case 9: tf_qmicro_9(k, ai, lda, b, ci, ldc); break;
        case 8: tf_qmicro_8(k, ai, lda, b, ci, ldc); break;
        case 7: tf_qmicro_7(k, ai, lda, b, ci, ldc); break;
        case 6: tf_qmicro_6(k, ai, lda, b, ci, ldc); break;
        case 5: tf_qmicro_5(k, ai, lda, b, ci, ldc); break;
        case 4: tf_qmicro_4(k, ai, lda, b, ci, ldc); break;
        case 3: tf_qmicro_3(k, ai, lda, b, ci, ldc); break;
        case 2: tf_qmicro_2(k, ai, lda, b, ci, ldc); break;
        default: tf_qmicro_1(k, ai, lda, b, ci, ldc); break;
        }
        i += r;
    }
#else
    for (int64_t i = 0; i < m; ++i) {
        int32_t row[32];
        for (int64_t j = 0; j < 32; ++j) row[j] = c[i * ldc + j];
        for (int64_t p = 0; p < k; ++p) {
            const int32_t av = a[i * lda + p];
            const int8_t *bg = b + (p / 4) * 128 + p % 4;
            for (int64_t j = 0; j < 32; ++j) row[j] += av * (int32_t)bg[j * 4];
        }
        for (int64_t j = 0; j < 32; ++j) c[i * ldc + j] = row[j];
    }
#endif
}

/* c[m x n] += a[m x k] (uint8 rows lda apart) @ rows [k0, k0 + k) of the n / 32 int8 panels
 * at bp, each of kp rows (whole groups of 4; k0 and kb multiples of 4); K in blocks of kb */
static void tf_panel_gemm_u8s8(int64_t m, int64_t n, int64_t k, const uint8_t *restrict a, int64_t lda,
        const int8_t *restrict bp, int64_t kp, int64_t k0, int32_t *restrict c, int64_t ldc, int64_t kb) {
    if (k > kp - k0) k = kp - k0 > 0 ? kp - k0 : 0;
    for (int64_t j = 0; j < n; j += 32) {
        const int8_t *panel = bp + (j / 32) * kp * 32 + k0 * 32;
        for (int64_t p0 = 0; p0 < k; p0 += kb)
            tf_qpanel_rows(m, k - p0 < kb ? k - p0 : kb, a + p0, lda, panel + p0 * 32, c + j, ldc);
    }
}
/* -- the same product by int16 panels, for kernels without VNNI ---------------------- */
/* The panels' layout as the int8 ones' (groups of 4 K values a column, 32 columns a panel),
 * each value widened to int16 at compile time, and the rows of a widened to int16 once per
 * block, so the core's inner loop is loads and vpmaddwd: two exact u8 x s8 products added
 * into an int32 lane (vpmaddubsw would be twice as dense but saturates its int16 pairs:
 * 255 * 127 * 2 > 32767). Widening both operands in the loop took 1.6x as long (NOTES.md,
 * session 37). */
#if defined(__AVX2__)
#include <immintrin.h>
/* acc += t, acc kept in its register: written as an intrinsic, GCC put each sum in t's
 * register and copied it back, 8 moves a group of 16 vector ops (5.8 -> 5.2 ms on
 * bert-base's first FFN product, NOTES.md session 37) */
#define TF_ADD32(acc, t) do { const __m256i tf_t_ = (t); __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(tf_t_)); } while (0)
/* MR rows x the 16 columns of a half panel at b (four registers a row) over whole groups
 * of 4 K values: a row's 4 widened values broadcast to each 64-bit lane, so a column's sum
 * lies in two adjacent int32 lanes (K values 0-1 and 2-3 of each group) until the store
 * adds them */
#define TF_QMICRO16(NAME, MR)                                                                   \
static inline __attribute__((always_inline)) void NAME(int64_t groups, const int16_t *restrict a, \
        int64_t lda, const int16_t *restrict b, int32_t *restrict c, int64_t ldc) {             \
    __m256i acc[MR][4];                                                                         \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)                                        \
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_setzero_si256(); \
    for (int64_t g = 0; g < groups; ++g) {                                                      \
        __m256i av[MR];                                                                         \
        _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) {                                  \
            int64_t q;                                                                          \
            memcpy(&q, a + r * lda + g * 4, 8);                                                 \
            av[r] = _mm256_set1_epi64x(q);                                                      \
        }                                                                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; ++v) {                                   \
            const __m256i bv = _mm256_loadu_si256((const __m256i *)(b + g * 128 + v * 16));     \
            _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r) TF_ADD32(acc[r][v], _mm256_madd_epi16(bv, av[r])); \
        }                                                                                       \
    }                                                                                           \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; ++r)                                        \
        _Pragma("GCC unroll 2") for (int v = 0; v < 4; v += 2) {                                \
            /* [c0 c0 c1 c1 | c2 c2 c3 c3] and the next four: pairs added, lanes in order */    \
            const __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r][v], acc[r][v + 1]), 0xD8); \
            int32_t *cr = c + r * ldc + v * 4;                                                  \
            _mm256_storeu_si256((__m256i *)cr, _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)cr), s)); \
        }                                                                                       \
}
TF_QMICRO16(tf_qmicro16_2, 2) TF_QMICRO16(tf_qmicro16_1, 1)
#endif

/* rows [0, m) of widened a (whole groups, rows lda apart) by one panel's block of groups */
static inline void tf_qpanel16_rows(int64_t m, int64_t groups, const int16_t *restrict a, int64_t lda,
        const int16_t *restrict b, int32_t *restrict c, int64_t ldc) {
#if defined(__AVX2__)
    for (int64_t h = 0; h < 2; ++h) {  /* the panel's two halves of 16 columns */
        int64_t i = 0;
        for (; i + 2 <= m; i += 2) tf_qmicro16_2(groups, a + i * lda, lda, b + h * 64, c + i * ldc + h * 16, ldc);
        if (i < m) tf_qmicro16_1(groups, a + i * lda, lda, b + h * 64, c + i * ldc + h * 16, ldc);
    }
#else
    for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < groups * 4; ++p) {
            const int32_t av = a[i * lda + p];
            const int16_t *bg = b + (p / 4) * 128 + p % 4;
            for (int64_t j = 0; j < 32; ++j) c[i * ldc + j] += av * (int32_t)bg[j * 4];
        }
#endif
}

/* int16s of the widened rows of a the product core keeps on its stack (32 KB) */
#define TF_QWIDE 16384
/* c[m x n] += a[m x k] (uint8 rows lda apart) @ rows [k0, k0 + k) of the n / 32 int16
 * panels at bp (as tf_panel_gemm_u8s8's); K in blocks of kb (at most TF_QWIDE / 4), each
 * block's rows widened to int16 (zeros to whole groups) as many at a time as TF_QWIDE holds,
 * then taken by every panel in turn */
static void tf_panel_gemm_u8s16(int64_t m, int64_t n, int64_t k, const uint8_t *restrict a, int64_t lda,
        const int16_t *restrict bp, int64_t kp, int64_t k0, int32_t *restrict c, int64_t ldc, int64_t kb) {
    if (k > kp - k0) k = kp - k0 > 0 ? kp - k0 : 0;
    if (kb > TF_QWIDE / 4) kb = TF_QWIDE / 4;
    int16_t aw[TF_QWIDE] __attribute__((aligned(64)));
    for (int64_t p0 = 0; p0 < k; p0 += kb) {
        const int64_t kc = k - p0 < kb ? k - p0 : kb, groups = (kc + 3) / 4, ldw = groups * 4, rows = TF_QWIDE / ldw;
        for (int64_t i0 = 0; i0 < m; i0 += rows) {
            const int64_t mr = m - i0 < rows ? m - i0 : rows;
            for (int64_t i = 0; i < mr; ++i) {
                const uint8_t *ar = a + (i0 + i) * lda + p0;
                int16_t *wr = aw + i * ldw;
                int64_t p = 0;
#if defined(__AVX2__)
                for (; p + 16 <= kc; p += 16)
                    _mm256_storeu_si256((__m256i *)(wr + p), _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ar + p))));
#endif
                for (; p < ldw; ++p) wr[p] = p < kc ? ar[p] : 0;
            }
            for (int64_t j = 0; j < n; j += 32)
                tf_qpanel16_rows(mr, groups, aw, ldw, bp + (j / 32) * kp * 32 + (k0 + p0) * 32, c + i0 * ldc + j, ldc);
        }
    }
}
"""

INDEX_PRELUDE = r"""
/* -- indices read at run time (IndexCheck): wrap negatives, never address out of range -- */
/* The first bad index claims word 0 (site + 1) and leaves its value in word 1; threads
 * that find another one later keep out. Cold and out of line: valid indices pay two
 * compares and a predictable branch. */
static void __attribute__((noinline, cold)) tf_index_fault(int64_t *status, int64_t site, int64_t i) {
    int64_t none = 0;
    if (__atomic_compare_exchange_n(&status[0], &none, site + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        __atomic_store_n(&status[1], i, __ATOMIC_RELAXED);
}
static inline int64_t tf_index(int64_t i, int64_t n, int64_t *status, int64_t site) {
    const int64_t w = i < 0 ? i + n : i;  /* i + n cannot overflow: i < 0 < n */
    if (__builtin_expect((uint64_t)w >= (uint64_t)n, 0)) { tf_index_fault(status, site, i); return 0; }
    return w;
}
"""

TAP_PRELUDE = r"""
/* -- the product core over tap rows (TapGemm): row p of B lies at b + off[p] ------------ */
/* A convolution from its input rows zero-padded on chip: K runs over (channel, taps), and
 * each tap's row of B is the padded rows shifted by a constant. The blocks are those of
 * tf_gemm_f32 with one table lookup per K step; sums run over p in order. */
#define TF_TAPS_V(NAME, VT, W, MR, NV)                                                          \
static inline __attribute__((always_inline)) void NAME(int64_t k, const float *restrict a,     \
        int64_t lda, const float *restrict b, const int32_t *restrict off, float *restrict c,   \
        int64_t ldc, int zero) {                                                                \
    VT acc[MR][NV];                                                                             \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                    \
            acc[r][v] = zero ? (VT){0} : *(const VT *)(c + r * ldc + W * v);                    \
    _Pragma("GCC unroll 2") for (int64_t p = 0; p < k; ++p) {                                   \
        const float *bp = b + off[p];                                                           \
        VT bv[NV];                                                                              \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) bv[v] = *(const VT *)(bp + W * v); \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) {                                 \
            const float ar = a[r * lda + p];                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];       \
        }                                                                                       \
    }                                                                                           \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                    \
            *(VT *)(c + r * ldc + W * v) = acc[r][v];                                           \
}
#ifdef __AVX512F__
#define TF_TAPS_ROWS 12
#define TF_TAPS_WIDTH 32
TF_TAPS_V(tf_taps_12, tf_v16, 16, 12, 2) TF_TAPS_V(tf_taps_11, tf_v16, 16, 11, 2) TF_TAPS_V(tf_taps_10, tf_v16, 16, 10, 2)
TF_TAPS_V(tf_taps_9, tf_v16, 16, 9, 2) TF_TAPS_V(tf_taps_8, tf_v16, 16, 8, 2) TF_TAPS_V(tf_taps_7, tf_v16, 16, 7, 2)
TF_TAPS_V(tf_taps_6, tf_v16, 16, 6, 2) TF_TAPS_V(tf_taps_5, tf_v16, 16, 5, 2) TF_TAPS_V(tf_taps_4, tf_v16, 16, 4, 2)
TF_TAPS_V(tf_taps_3, tf_v16, 16, 3, 2) TF_TAPS_V(tf_taps_2, tf_v16, 16, 2, 2) TF_TAPS_V(tf_taps_1, tf_v16, 16, 1, 2)
/* rows [0, m) of a 16-column strip whose columns ``mask`` marks (the others are not read
 * nor written) */
#define TF_TAPS_MASKED(NAME, MR)                                                                \
static inline __attribute__((always_inline)) void NAME(int64_t k, const float *restrict a,     \
        int64_t lda, const float *restrict b, const int32_t *restrict off, float *restrict c,   \
        int64_t ldc, __mmask16 mask, int zero) {                                                \
    __m512 acc[MR];                                                                             \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                       \
        acc[r] = zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, c + r * ldc);         \
    for (int64_t p = 0; p < k; ++p) {                                                           \
        const __m512 bv = _mm512_maskz_loadu_ps(mask, b + off[p]);                              \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r)                                   \
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + p]), bv, acc[r]);               \
    }                                                                                           \
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(c + r * ldc, mask, acc[r]); \
}
TF_TAPS_MASKED(tf_taps_masked_12, 12) TF_TAPS_MASKED(tf_taps_masked_4, 4) TF_TAPS_MASKED(tf_taps_masked_1, 1)
#else
#define TF_TAPS_ROWS 6
#define TF_TAPS_WIDTH 16
TF_TAPS_V(tf_taps_6, tf_v8, 8, 6, 2) TF_TAPS_V(tf_taps_5, tf_v8, 8, 5, 2) TF_TAPS_V(tf_taps_4, tf_v8, 8, 4, 2)
TF_TAPS_V(tf_taps_3, tf_v8, 8, 3, 2) TF_TAPS_V(tf_taps_2, tf_v8, 8, 2, 2) TF_TAPS_V(tf_taps_1, tf_v8, 8, 1, 2)
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* the last n - j < 16 columns: rows [0, MR) of an 8-column strip, the columns ``mask``
 * marks (the others are not read nor written: vmaskmovps), or all eight; one fused
 * multiply-add a K step, as the strips sum */
#define TF_TAPS8(NAME, MR, LOAD, STORE)                                                         \
static inline __attribute__((always_inline)) void NAME(int64_t k, const float *restrict a,     \
        int64_t lda, const float *restrict b, const int32_t *restrict off, float *restrict c,   \
        int64_t ldc, __m256i mask, int zero) {                                                  \
    __m256 acc[MR];                                                                             \
    (void)mask;                                                                                 \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r)                                        \
        acc[r] = zero ? _mm256_setzero_ps() : LOAD(c + r * ldc);                                \
    for (int64_t p = 0; p < k; ++p) {                                                           \
        const __m256 bv = LOAD(b + off[p]);                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r)                                    \
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a[r * lda + p]), bv, acc[r]);               \
    }                                                                                           \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) STORE(c + r * ldc, acc[r]);            \
}
#define TF_LOAD8(p) _mm256_loadu_ps(p)
#define TF_STORE8(p, v) _mm256_storeu_ps(p, v)
#define TF_MLOAD8(p) _mm256_maskload_ps(p, mask)
#define TF_MSTORE8(p, v) _mm256_maskstore_ps(p, mask, v)
TF_TAPS8(tf_taps8_8, 8, TF_LOAD8, TF_STORE8) TF_TAPS8(tf_taps8_4, 4, TF_LOAD8, TF_STORE8)
TF_TAPS8(tf_taps8_1, 1, TF_LOAD8, TF_STORE8)
TF_TAPS8(tf_taps_masked8_8, 8, TF_MLOAD8, TF_MSTORE8) TF_TAPS8(tf_taps_masked8_4, 4, TF_MLOAD8, TF_MSTORE8)
TF_TAPS8(tf_taps_masked8_1, 1, TF_MLOAD8, TF_MSTORE8)
#endif
#endif

/* rows [0, m) of a strip of TF_TAPS_WIDTH columns: blocks of TF_TAPS_ROWS rows, the last
 * rows (more than a block, fewer than two) as two near-equal blocks */
static inline __attribute__((always_inline)) void tf_taps_strip(int64_t m, int64_t k,
        const float *restrict a, int64_t lda, const float *restrict b, const int32_t *restrict off,
        float *restrict c, int64_t ldc, int zero) {
    int64_t i = 0;
    while (m - i > 0) {
        const int64_t left = m - i;
        const int64_t r = left >= 2 * TF_TAPS_ROWS ? TF_TAPS_ROWS : (left > TF_TAPS_ROWS ? (left + 1) / 2 : left);
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        switch (r) {
#ifdef __AVX512F__
        case 12: tf_taps_12(k, ai, lda, b, off, ci, ldc, zero); break;
        case 11: tf_taps_11(k, ai, lda, b, off, ci, ldc, zero); break;
        case 10: tf_taps_10(k, ai, lda, b, off, ci, ldc, zero); break;
        case 9: tf_taps_9(k, ai, lda, b, off, ci, ldc, zero); break;
        case 8: tf_taps_8(k, ai, lda, b, off, ci, ldc, zero); break;
        case 7: tf_taps_7(k, ai, lda, b, off, ci, ldc, zero); break;
#endif
        case 6: tf_taps_6(k, ai, lda, b, off, ci, ldc, zero); break;
        case 5: tf_taps_5(k, ai, lda, b, off, ci, ldc, zero); break;
        case 4: tf_taps_4(k, ai, lda, b, off, ci, ldc, zero); break;
        case 3: tf_taps_3(k, ai, lda, b, off, ci, ldc, zero); break;
        case 2: tf_taps_2(k, ai, lda, b, off, ci, ldc, zero); break;
        default: tf_taps_1(k, ai, lda, b, off, ci, ldc, zero); break;
        }
        i += r;
    }
}

/* The entry point is out of line where registers are few: with AVX2's 16, the core
 * inlined into a kernel that knows its sizes had one accumulator of its 6 x 16 block
 * spilled to the stack, a store and a load on every K step's critical path
 * (EfficientNet-B0's SE-gated 1 x 1 convolution: 680 us inlined, 355 out of line) */
#ifdef __AVX512F__
#define TF_TAPS_ENTRY static
#else
#define TF_TAPS_ENTRY static __attribute__((noinline))
#endif
/* c[m x n] += a[m x k] @ B, B[p][q] = b[off[p] + q], row-major with leading dimensions
 * lda and ldc; with ``zero``, c = a @ B (c is not read). Reads only b[off[p] + q] for
 * q < n. */
TF_TAPS_ENTRY void tf_tap_gemm_f32(int64_t m, int64_t n, int64_t k, const float *restrict a, int64_t lda,
        const float *restrict b, const int32_t *restrict off, float *restrict c, int64_t ldc, int zero) {
    int64_t j = 0;
    for (; j + TF_TAPS_WIDTH <= n; j += TF_TAPS_WIDTH) tf_taps_strip(m, k, a, lda, b + j, off, c + j, ldc, zero);
#ifdef __AVX512F__
    for (; j < n; j += 16) {  /* the last n - j < 32 columns: 16-wide strips, the last one masked or by rows */
        const int64_t w = n - j < 16 ? n - j : 16;
        const __mmask16 mask = (__mmask16)((1u << w) - 1u);
        int64_t i = 0;
        for (; i + 12 <= m; i += 12) tf_taps_masked_12(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
        for (; i + 4 <= m; i += 4) tf_taps_masked_4(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
        for (; i < m; ++i) tf_taps_masked_1(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; j < n; j += 8) {  /* the last n - j < 16 columns: an 8-column strip, the last one masked */
        const int64_t w = n - j < 8 ? n - j : 8;
        const __m256i mask = tf_first8(w);
        int64_t i = 0;
        if (w == 8) {
            for (; i + 8 <= m; i += 8) tf_taps8_8(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
            for (; i + 4 <= m; i += 4) tf_taps8_4(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
            for (; i < m; ++i) tf_taps8_1(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
        } else {
            for (; i + 8 <= m; i += 8) tf_taps_masked8_8(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
            for (; i + 4 <= m; i += 4) tf_taps_masked8_4(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
            for (; i < m; ++i) tf_taps_masked8_1(k, a + i * lda, lda, b + j, off, c + i * ldc + j, ldc, mask, zero);
        }
    }
#else
    for (int64_t i = 0; i < m && j < n; ++i)  /* the last n - j < 16 columns, one sum at a time */
        for (int64_t q = j; q < n; ++q) {
            float s = zero ? 0.0f : c[i * ldc + q];
            for (int64_t p = 0; p < k; ++p) s += a[i * lda + p] * b[off[p] + q];
            c[i * ldc + q] = s;
        }
#endif
}
"""


TRANSPOSE_PRELUDE = r"""
/* -- a 2-D block turned over (Transpose): d[j * ds + i] = s[i * ss + j], in 16 x 16 blocks
 * where the host has AVX-512 (tf_transpose16_f32, PRELUDE), in 8 x 8 blocks with AVX2 (the
 * partial blocks at the edges element by element) ---------------------------------------- */
#if !defined(__AVX512F__) && defined(__AVX2__)
#include <immintrin.h>
static inline void tf_transpose8_f32(const float *restrict s, int64_t ss, float *restrict d, int64_t ds) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * ss);
    for (int i = 0; i < 8; i += 2) {  /* pairs of rows interleaved */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {  /* then pairs of pairs: each 128-bit half holds 4 x 4 */
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {  /* the halves of rows 0-3 and 4-7 brought together */
        _mm256_storeu_ps(d + i * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(d + (i + 4) * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
#endif

static void tf_transpose_f32(const float *restrict s, int64_t ss, float *restrict d, int64_t ds,
                             int64_t rows, int64_t cols) {
#ifdef __AVX512F__
    for (int64_t i = 0; i < rows; i += 16)
        for (int64_t j = 0; j < cols; j += 16)
            tf_transpose16_f32(s + i * ss + j, ss, d + j * ds + i, ds, rows - i < 16 ? rows - i : 16,
                               cols - j < 16 ? cols - j : 16);
#else
    int64_t r8 = 0, c8 = 0;
#ifdef __AVX2__
    r8 = rows & ~(int64_t)7, c8 = cols & ~(int64_t)7;
    for (int64_t i = 0; i < r8; i += 8)
        for (int64_t j = 0; j < c8; j += 8) tf_transpose8_f32(s + i * ss + j, ss, d + j * ds + i, ds);
#endif
    for (int64_t i = 0; i < rows; ++i)  /* what the blocks leave: the last rows, the last columns */
        for (int64_t j = i < r8 ? c8 : 0; j < cols; ++j) d[j * ds + i] = s[i * ss + j];
#endif
}

/* -- a depthwise convolution's taps over vectors of 16 channels (LaneTaps) -------------- */
/* out[(r * width + c) * 16 + j] = sum over t of x[(r * rs + c * cs + off[t]) * 16 + j] * w[t * 16 + j]:
 * eight positions of a row a block, their sums in registers, each tap's weights loaded
 * once a block; taps summed in order. */
typedef float tf_lanes16 __attribute__((vector_size(64)));
static void tf_lane_taps_f32(const float *restrict x, const float *restrict w, float *restrict out, int64_t rows,
                             int64_t width, int64_t rs, int64_t cs, const int32_t *restrict off, int64_t taps) {
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
    /* AVX2: the 16 channels as two halves of 8, each over all taps (eight 8-lane sums in
     * registers; GCC spills 64-byte generic vectors here) */
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c0 = 0; c0 < width; c0 += 8) {
            const int64_t n = width - c0 < 8 ? width - c0 : 8;
            const float *xb = x + (r * rs + c0 * cs) * 16;
            for (int h = 0; h < 16; h += 8) {
                __m256 acc[8];
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
                for (int64_t t = 0; t < taps; ++t) {
                    const __m256 wv = _mm256_loadu_ps(w + t * 16 + h);
                    const float *xt = xb + (int64_t)off[t] * 16 + h;
                    _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i)
                        if (i < n) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xt + i * cs * 16), wv, acc[i]);
                }
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i)
                    if (i < n) _mm256_storeu_ps(out + (r * width + c0 + i) * 16 + h, acc[i]);
            }
        }
    return;
#endif
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c0 = 0; c0 < width; c0 += 8) {
            const int64_t n = width - c0 < 8 ? width - c0 : 8;
            const float *xb = x + (r * rs + c0 * cs) * 16;
            tf_lanes16 acc[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) acc[i] = (tf_lanes16){0};
            for (int64_t t = 0; t < taps; ++t) {
                tf_lanes16 wv;
                memcpy(&wv, w + t * 16, sizeof wv);
                const float *xt = xb + (int64_t)off[t] * 16;
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i) {
                    if (i < n) {
                        tf_lanes16 xv;
                        memcpy(&xv, xt + i * cs * 16, sizeof xv);
                        acc[i] += xv * wv;
                    }
                }
            }
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i)
                if (i < n) memcpy(out + (r * width + c0 + i) * 16, &acc[i], sizeof acc[i]);
        }
}
"""

WINOGRAD_PRELUDE = r"""
/* -- a 3 x 3 convolution by minimal filtering F(4 x 4, 3 x 3) (Winograd) -------------- */
/* c[k * ldc + r * width + q] (k < kn, r < rows, q < width) = the 3 x 3 convolution of x's
 * planes (chans of h x w, zero outside) at rows row0 + r, columns col0 + q, by the filter
 * whose transform G g G^T is u, in the order the products read it (one stream):
 * u[((ch / kc) * 36 + xi) * kn * kc + k * kc + ch % kc] for xi < 36, kc dividing chans.
 * The rows and columns are cut into 4 x 4 tiles; chunk by chunk of kc channels, each tile's 6 x 6 patch
 * is turned (B^T d B: columns along whole padded rows, then rows) into v[36][kc][tiles],
 * the 36 products u_xi @ v_xi run on the tap core into m[36][kn][tiles] (the first chunk
 * starts them at zero), and each tile is turned back (A^T m A) into c. Matrices: Lavin and
 * Gray's points 0, +-1, +-2 (tile_ir/ir.py, WINOGRAD_BT/G/AT). */
static void tf_winograd43_f32(const float *restrict x, int64_t chans, int64_t h, int64_t w, int64_t row0, int64_t col0,
        const float *restrict u, int64_t kn, float *restrict v, int64_t kc, float *restrict m,
        float *restrict c, int64_t ldc, int64_t rows, int64_t width) {
    const int64_t th = (rows + 3) / 4, tw = (width + 3) / 4, tiles = th * tw, pw = 4 * tw + 2;
    int64_t qa = col0 < 0 ? -col0 : 0, qb = w - col0;  /* the patch columns inside x: [qa, qb) */
    if (qa > pw) qa = pw;
    if (qb > pw) qb = pw;
    if (qb < qa) qb = qa;
    int32_t *off = (int32_t *)tf_alloc_raw((size_t)kc * sizeof(int32_t));
    float *d = (float *)tf_alloc_raw((size_t)12 * pw * sizeof(float)), *e = d + 6 * pw;
    float *q = (float *)tf_alloc_raw((size_t)28 * tw * sizeof(float)), *row = q + 24 * tw;
    for (int64_t p = 0; p < kc; ++p) off[p] = (int32_t)(p * tiles);
    const int64_t vs = kc * tiles, ms = kn * tiles;
    for (int64_t c0 = 0; c0 < chans; c0 += kc) {
        const int64_t kk = chans - c0 < kc ? chans - c0 : kc;
        for (int64_t ch = 0; ch < kk; ++ch) {
            const float *xc = x + (c0 + ch) * h * w;
            for (int64_t ty = 0; ty < th; ++ty) {
                for (int a = 0; a < 6; ++a) {  /* the tile row's six input rows, zero-padded */
                    const int64_t y = row0 + 4 * ty + a;
                    float *dr = d + a * pw;
                    if (y < 0 || y >= h) { memset(dr, 0, (size_t)pw * sizeof(float)); continue; }
                    memset(dr, 0, (size_t)qa * sizeof(float));
                    memcpy(dr + qa, xc + y * w + col0 + qa, (size_t)(qb - qa) * sizeof(float));
                    memset(dr + qb, 0, (size_t)(pw - qb) * sizeof(float));
                }
                const float *d0 = d, *d1 = d + pw, *d2 = d + 2 * pw, *d3 = d + 3 * pw, *d4 = d + 4 * pw, *d5 = d + 5 * pw;
                #pragma omp simd
                for (int64_t b = 0; b < pw; ++b) {  /* B^T d: along whole rows */
                    e[b] = 4 * d0[b] - 5 * d2[b] + d4[b];
                    e[pw + b] = -4 * d1[b] - 4 * d2[b] + d3[b] + d4[b];
                    e[2 * pw + b] = 4 * d1[b] - 4 * d2[b] - d3[b] + d4[b];
                    e[3 * pw + b] = -2 * d1[b] - d2[b] + 2 * d3[b] + d4[b];
                    e[4 * pw + b] = 2 * d1[b] - d2[b] - 2 * d3[b] + d4[b];
                    e[5 * pw + b] = 4 * d1[b] - 5 * d3[b] + d5[b];
                }
                for (int a = 0; a < 6; ++a) {  /* (B^T d) B: each tile's six columns */
                    const float *r = e + a * pw;
                    float *vv = v + a * 6 * vs + ch * tiles + ty * tw;
                    #pragma omp simd
                    for (int64_t t = 0; t < tw; ++t) {
                        const float r0 = r[4 * t], r1 = r[4 * t + 1], r2 = r[4 * t + 2], r3 = r[4 * t + 3],
                                    r4 = r[4 * t + 4], r5 = r[4 * t + 5];
                        vv[t] = 4 * r0 - 5 * r2 + r4;
                        vv[vs + t] = -4 * r1 - 4 * r2 + r3 + r4;
                        vv[2 * vs + t] = 4 * r1 - 4 * r2 - r3 + r4;
                        vv[3 * vs + t] = -2 * r1 - r2 + 2 * r3 + r4;
                        vv[4 * vs + t] = 2 * r1 - r2 - 2 * r3 + r4;
                        vv[5 * vs + t] = 4 * r1 - 5 * r3 + r5;
                    }
                }
            }
        }
        for (int64_t xi = 0; xi < 36; ++xi)
            tf_tap_gemm_f32(kn, tiles, kk, u + (c0 / kc * 36 + xi) * kn * kc, kc, v + xi * vs, off, m + xi * ms, tiles, c0 == 0);
    }
    for (int64_t k = 0; k < kn; ++k) {
        for (int64_t ty = 0; ty < th; ++ty) {
            const float *mk = m + k * tiles + ty * tw;
            for (int j = 0; j < 6; ++j) {  /* A^T m: the tile's four output rows of column j */
                const float *m0 = mk + j * ms, *m1 = mk + (6 + j) * ms, *m2 = mk + (12 + j) * ms, *m3 = mk + (18 + j) * ms,
                            *m4 = mk + (24 + j) * ms, *m5 = mk + (30 + j) * ms;
                #pragma omp simd
                for (int64_t t = 0; t < tw; ++t) {
                    q[(0 * 6 + j) * tw + t] = m0[t] + m1[t] + m2[t] + m3[t] + m4[t];
                    q[(1 * 6 + j) * tw + t] = m1[t] - m2[t] + 2 * m3[t] - 2 * m4[t];
                    q[(2 * 6 + j) * tw + t] = m1[t] + m2[t] + 4 * m3[t] + 4 * m4[t];
                    q[(3 * 6 + j) * tw + t] = m1[t] - m2[t] + 8 * m3[t] - 8 * m4[t] + m5[t];
                }
            }
            for (int i = 0; i < 4 && 4 * ty + i < rows; ++i) {  /* (A^T m) A: a row of outputs */
                const float *qi = q + i * 6 * tw;
                #pragma omp simd
                for (int64_t t = 0; t < tw; ++t) {
                    const float a0 = qi[t], a1 = qi[tw + t], a2 = qi[2 * tw + t], a3 = qi[3 * tw + t], a4 = qi[4 * tw + t],
                                a5 = qi[5 * tw + t];
                    row[4 * t] = a0 + a1 + a2 + a3 + a4;
                    row[4 * t + 1] = a1 - a2 + 2 * a3 - 2 * a4;
                    row[4 * t + 2] = a1 + a2 + 4 * a3 + 4 * a4;
                    row[4 * t + 3] = a1 - a2 + 8 * a3 - 8 * a4 + a5;
                }
                memcpy(c + k * ldc + (4 * ty + i) * width, row, (size_t)width * sizeof(float));
            }
        }
    }
    free(off);
    free(d);
    free(q);
}
"""


PLANE_TAPS_PRELUDE = r"""
/* -- a depthwise convolution's taps over channel planes read where they lie (PlaneTaps) --- */
/* A row of a plane split by column phase: phase p's q-th value is src[q * sx + p - left];
 * each phase row pw long, phases pw apart. Only the values inside [0, iw) are written: the
 * others are zeros the caller's ring holds already (zeroed once a call, and every row of a
 * call covers the same columns). A tail of zeros written per row was GCC's `rep stos`,
 * a third of MobileNetV2's stride-2 depthwise time (NOTES.md, session 37). */
typedef float tf_vq __attribute__((vector_size(64), aligned(4)));
#if !defined(__AVX512F__) && defined(__AVX2__)
#include <immintrin.h>
#endif
static inline void tf_plane_row_f32(float *restrict dst, const float *restrict src, int64_t iw, int64_t sx,
        int64_t left, int64_t pw) {
    if (sx == 1) {
        const int64_t lo = left < pw ? left : pw, hi = left + iw < pw ? left + iw : pw;
        if (hi > lo) memcpy(dst + lo, src + lo - left, (size_t)(hi - lo) * sizeof(float));
        return;
    }
#if !defined(__AVX512F__) && defined(__AVX2__)
    if (sx == 2) {  /* both phases from the same two loads (AVX2: the compiler's strided
                     * loads read the row once a phase, by vpermd) */
        const float *s = src - left;  /* phase p's q-th value is s[2 * q + p] */
        float *d0 = dst, *d1 = dst + pw;
        const int64_t qa = (left + 1) / 2, qb = (iw + left) / 2 < pw ? (iw + left) / 2 : pw;
        int64_t q = 0;
        for (; q < qa && q < pw; ++q) {
            const int64_t i = 2 * q - left;
            d0[q] = i >= 0 && i < iw ? src[i] : 0.0f;
            d1[q] = i + 1 >= 0 && i + 1 < iw ? src[i + 1] : 0.0f;
        }
        for (; q + 8 <= qb; q += 8) {  /* s[2q .. 2q + 15] inside the row */
            const __m256 a = _mm256_loadu_ps(s + 2 * q), b = _mm256_loadu_ps(s + 2 * q + 8);
            _mm256_storeu_ps(d0 + q, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8)));
            _mm256_storeu_ps(d1 + q, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8)));
        }
        const int64_t qe = (iw + left + 1) / 2 < pw ? (iw + left + 1) / 2 : pw;  /* past it both are zeros */
        for (; q < qe; ++q) {
            const int64_t i = 2 * q - left;
            d0[q] = i >= 0 && i < iw ? src[i] : 0.0f;
            d1[q] = i + 1 >= 0 && i + 1 < iw ? src[i + 1] : 0.0f;
        }
        return;
    }
#endif
    for (int64_t p = 0; p < sx; ++p) {
        float *d = dst + p * pw;
        int64_t lo = left - p > 0 ? (left - p + sx - 1) / sx : 0;
        int64_t hi = iw - 1 + left - p >= 0 ? (iw - 1 + left - p) / sx + 1 : 0;
        lo = lo < pw ? lo : pw;
        hi = hi < pw ? (hi > lo ? hi : lo) : pw;
        const float *s = src + p - left;
        if (sx == 2) {  /* a constant stride: the compiler's interleaved loads */
            #pragma omp simd
            for (int64_t q = lo; q < hi; ++q) d[q] = s[2 * q];
        } else {
            for (int64_t q = lo; q < hi; ++q) d[q] = s[q * sx];
        }
    }
}
/* NV vectors of a row's sums from column c, in registers over the taps (the tap rows at
 * tap[t], weights w[t]); the first n of them stored at o + c */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* (AVX2: 8-lane registers, two a group of 16; GCC spills 64-byte generic vectors here) */
#define TF_PLANE_SUMS(NV)                                                                          \
static inline __attribute__((always_inline)) void tf_plane_sums##NV(const float *const *tap,     \
        const float *w, int64_t taps, int64_t c, float *restrict o, int64_t n) {                   \
    __m256 a[2 * NV];                                                                              \
    _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v) a[v] = _mm256_setzero_ps();           \
    for (int64_t t = 0; t < taps; ++t) {                                                           \
        const __m256 wt = _mm256_set1_ps(w[t]);                                                    \
        const float *p = tap[t] + c;                                                               \
        _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v)                                   \
            a[v] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p + 8 * v), a[v]);                          \
    }                                                                                              \
    _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v) {                                     \
        const int64_t rest = n - 8 * v;                                                            \
        if (rest >= 8) _mm256_storeu_ps(o + c + 8 * v, a[v]);                                      \
        else if (rest > 0) _mm256_maskstore_ps(o + c + 8 * v, tf_first8(rest), a[v]);              \
    }                                                                                              \
}
#else
#define TF_PLANE_SUMS(NV)                                                                          \
static inline __attribute__((always_inline)) void tf_plane_sums##NV(const float *const *tap,     \
        const float *w, int64_t taps, int64_t c, float *restrict o, int64_t n) {                   \
    tf_vq a[NV];                                                                                   \
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) a[v] = (tf_vq){0};                         \
    for (int64_t t = 0; t < taps; ++t) {                                                           \
        const float wt = w[t], *p = tap[t] + c;                                                    \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) a[v] += wt * *(const tf_vq *)(p + 16 * v); \
    }                                                                                              \
    if (n >= 16 * NV) {                                                                            \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) *(tf_vq *)(o + c + 16 * v) = a[v];    \
    } else {                                                                                       \
        float part[16 * NV] __attribute__((aligned(64)));                                          \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) *(tf_vq *)(part + 16 * v) = a[v];     \
        for (int64_t i = 0; i < n; ++i) o[c + i] = part[i];                                        \
    }                                                                                              \
}
#endif
TF_PLANE_SUMS(4) TF_PLANE_SUMS(3) TF_PLANE_SUMS(2) TF_PLANE_SUMS(1)
/* out[j * ldo + r * ow + c] = sum over taps (ty, tx) of w[j * kh * kw + ty * kw + tx] *
 * x[j * ih * iw + iy * iw + ix], iy = (row0 + r) * sy + ty * dy - top, ix = c * sx + tx * dx -
 * left, zero outside the plane; channels j < chans, rows r < rows, columns c < ow. Each
 * input row a channel's output rows read is copied once into a ring of (kh - 1) * dy + 1
 * rows on the stack, split by column phase, zero padded to what the last vector reads */
static inline __attribute__((always_inline)) void tf_plane_taps_body(const float *restrict x, int64_t chans,
        int64_t ih, int64_t iw, const float *restrict w, int64_t kh, int64_t kw, int64_t sy, int64_t sx, int64_t dy,
        int64_t dx, int64_t top, int64_t left, int64_t row0, int64_t rows, int64_t ow, float *restrict out, int64_t ldo) {
    const int64_t span = (kh - 1) * dy + 1, reach = ((kw - 1) * dx) / sx, taps = kh * kw;
    const int64_t pw = ((((ow + 15) & ~(int64_t)15) + reach) + 15) & ~(int64_t)15;
    float ring[span * sx * pw] __attribute__((aligned(64)));
    memset(ring, 0, sizeof ring);  /* the zeros around every row's values (tf_plane_row_f32) */
    int64_t held[span];
    const float *tap[taps];
    for (int64_t j = 0; j < chans; ++j) {
        const float *xp = x + j * ih * iw, *wj = w + j * taps;
        for (int64_t s = 0; s < span; ++s) held[s] = INT64_MIN;
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t iy0 = (row0 + r) * sy - top;
            for (int64_t ty = 0; ty < kh; ++ty) {
                const int64_t iy = iy0 + ty * dy, s = ((iy % span) + span) % span;
                float *row = ring + s * sx * pw;
                if (held[s] != iy) {
                    held[s] = iy;
                    if (iy < 0 || iy >= ih) memset(row, 0, (size_t)(sx * pw) * sizeof(float));
                    else tf_plane_row_f32(row, xp + iy * iw, iw, sx, left, pw);
                }
                for (int64_t tx = 0; tx < kw; ++tx) tap[ty * kw + tx] = row + ((tx * dx) % sx) * pw + (tx * dx) / sx;
            }
            float *o = out + j * ldo + r * ow;
            int64_t c = 0;
            for (; c + 64 <= ow; c += 64) tf_plane_sums4(tap, wj, taps, c, o, 64);
            switch ((ow - c + 15) / 16) {
            case 4: tf_plane_sums4(tap, wj, taps, c, o, ow - c); break;
            case 3: tf_plane_sums3(tap, wj, taps, c, o, ow - c); break;
            case 2: tf_plane_sums2(tap, wj, taps, c, o, ow - c); break;
            case 1: tf_plane_sums1(tap, wj, taps, c, o, ow - c); break;
            default: break;
            }
        }
    }
}
#ifdef __AVX512F__
/* Unit strides and dilations: no ring. Each tap row is read where it lies, a vector's lanes
 * outside the row masked to zero (masked-off lanes are not read), rows outside the plane
 * read from a row of zeros: the ring's values and sums, in the same order, without its
 * copy (EfficientNet-B0's 3 x 3 over 112 x 112: 0.92 of the ring's time hot, 0.89 of the
 * padded tile's; benchmarks/NOTES.md, session 34) */
static inline __mmask16 tf_lanes_in(int64_t first, int64_t iw) {  /* lanes l with 0 <= first + l < iw */
    const int64_t lo = -first, hi = iw - first;
    uint32_t m = 0xFFFFu;
    if (lo > 0) m = lo >= 16 ? 0u : (m << lo) & 0xFFFFu;
    if (hi < 16) m &= hi <= 0 ? 0u : (1u << hi) - 1u;
    return (__mmask16)m;
}
/* NV vectors of a row's sums from column c over the tap rows row[ty] (input column c + tx -
 * left for tap tx); the first n of them stored at o + c */
#define TF_PLANE_DIRECT(NV)                                                                        \
static inline __attribute__((always_inline)) void tf_plane_direct##NV(const float *const *row,   \
        const float *w, int64_t kh, int64_t kw, int64_t left, int64_t iw, int64_t c, float *restrict o, int64_t n) { \
    __m512 a[NV];                                                                                  \
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) a[v] = _mm512_setzero_ps();               \
    if (c - left < 0 || c + 16 * NV + kw - 1 - left > iw) {  /* lanes past the row's ends */       \
        for (int64_t ty = 0; ty < kh; ++ty)                                                        \
            for (int64_t tx = 0; tx < kw; ++tx) {                                                  \
                const __m512 wt = _mm512_set1_ps(w[ty * kw + tx]);                                 \
                const float *p = row[ty] + c + tx - left;                                          \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) a[v] = _mm512_fmadd_ps(wt,     \
                    _mm512_maskz_loadu_ps(tf_lanes_in(c + 16 * v + tx - left, iw), p + 16 * v), a[v]); \
            }                                                                                      \
    } else {                                                                                       \
        for (int64_t ty = 0; ty < kh; ++ty)                                                        \
            for (int64_t tx = 0; tx < kw; ++tx) {                                                  \
                const __m512 wt = _mm512_set1_ps(w[ty * kw + tx]);                                 \
                const float *p = row[ty] + c + tx - left;                                          \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                               \
                    a[v] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(p + 16 * v), a[v]);                 \
            }                                                                                      \
    }                                                                                              \
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                         \
        const int64_t rest = n - 16 * v;                                                           \
        if (rest >= 16) _mm512_storeu_ps(o + c + 16 * v, a[v]);                                    \
        else if (rest > 0) _mm512_mask_storeu_ps(o + c + 16 * v, (__mmask16)((1u << rest) - 1u), a[v]); \
    }                                                                                              \
}
TF_PLANE_DIRECT(4) TF_PLANE_DIRECT(3) TF_PLANE_DIRECT(2) TF_PLANE_DIRECT(1)
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* The same with AVX2: a 16-column group as two 8-lane vectors, the lanes outside the row
 * masked by vmaskmovps (masked-off lanes are not read) */
static inline __m256i tf_lanes_in8(int64_t first, int64_t iw) {  /* lanes l with 0 <= first + l < iw */
    const __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int)(first < -64 ? -64 : first > iw ? iw : first)),
                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), at), _mm256_cmpgt_epi32(_mm256_set1_epi32((int)iw), at));
}
#define TF_PLANE_DIRECT(NV)                                                                        \
static inline __attribute__((always_inline)) void tf_plane_direct##NV(const float *const *row,   \
        const float *w, int64_t kh, int64_t kw, int64_t left, int64_t iw, int64_t c, float *restrict o, int64_t n) { \
    __m256 a[2 * NV];                                                                              \
    _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v) a[v] = _mm256_setzero_ps();           \
    if (c - left < 0 || c + 16 * NV + kw - 1 - left > iw) {  /* lanes past the row's ends */       \
        for (int64_t ty = 0; ty < kh; ++ty)                                                        \
            for (int64_t tx = 0; tx < kw; ++tx) {                                                  \
                const __m256 wt = _mm256_set1_ps(w[ty * kw + tx]);                                 \
                const float *p = row[ty] + c + tx - left;                                          \
                _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v) a[v] = _mm256_fmadd_ps(wt, \
                    _mm256_maskload_ps(p + 8 * v, tf_lanes_in8(c + 8 * v + tx - left, iw)), a[v]);  \
            }                                                                                      \
    } else {                                                                                       \
        for (int64_t ty = 0; ty < kh; ++ty)                                                        \
            for (int64_t tx = 0; tx < kw; ++tx) {                                                  \
                const __m256 wt = _mm256_set1_ps(w[ty * kw + tx]);                                 \
                const float *p = row[ty] + c + tx - left;                                          \
                _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v)                           \
                    a[v] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p + 8 * v), a[v]);                  \
            }                                                                                      \
    }                                                                                              \
    _Pragma("GCC unroll 8") for (int v = 0; v < 2 * NV; ++v) {                                     \
        const int64_t rest = n - 8 * v;                                                            \
        if (rest >= 8) _mm256_storeu_ps(o + c + 8 * v, a[v]);                                      \
        else if (rest > 0) _mm256_maskstore_ps(o + c + 8 * v, tf_first8(rest), a[v]);              \
    }                                                                                              \
}
TF_PLANE_DIRECT(4) TF_PLANE_DIRECT(3) TF_PLANE_DIRECT(2) TF_PLANE_DIRECT(1)
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
static inline __attribute__((always_inline)) void tf_plane_direct_body(const float *restrict x, int64_t chans,
        int64_t ih, int64_t iw, const float *restrict w, int64_t kh, int64_t kw, int64_t top, int64_t left,
        int64_t row0, int64_t rows, int64_t ow, float *restrict out, int64_t ldo) {
    /* a row of zeros for rows outside the plane, read from up to kw - 1 - left + 15 past
     * its ends (those lanes masked): its own reads stay inside it */
    float zeros[iw + 2 * (kw + 16)] __attribute__((aligned(64)));
    memset(zeros, 0, sizeof zeros);
    const float *row[kh];
    for (int64_t j = 0; j < chans; ++j) {
        const float *xp = x + j * ih * iw, *wj = w + j * kh * kw;
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t iy0 = row0 + r - top;
            for (int64_t ty = 0; ty < kh; ++ty) {
                const int64_t iy = iy0 + ty;
                row[ty] = iy < 0 || iy >= ih ? zeros + kw + 16 : xp + iy * iw;
            }
            float *o = out + j * ldo + r * ow;
            int64_t c = 0;
#ifndef __AVX512F__
            /* AVX2's masks cost a compare and a slower load a vector: only the groups of 16
             * that cross the row's ends take them (a 112-wide row: 2 of 7, not all) */
            for (; c < ow && c - left < 0; c += 16) tf_plane_direct1(row, wj, kh, kw, left, iw, c, o, ow - c);
            for (; c + 64 <= ow && c + 64 + kw - 1 - left <= iw; c += 64)
                tf_plane_direct4(row, wj, kh, kw, left, iw, c, o, 64);
            for (; c < ow; c += 16) tf_plane_direct1(row, wj, kh, kw, left, iw, c, o, ow - c);
#else
            for (; c + 64 <= ow; c += 64) tf_plane_direct4(row, wj, kh, kw, left, iw, c, o, 64);
            switch ((ow - c + 15) / 16) {
            case 4: tf_plane_direct4(row, wj, kh, kw, left, iw, c, o, ow - c); break;
            case 3: tf_plane_direct3(row, wj, kh, kw, left, iw, c, o, ow - c); break;
            case 2: tf_plane_direct2(row, wj, kh, kw, left, iw, c, o, ow - c); break;
            case 1: tf_plane_direct1(row, wj, kh, kw, left, iw, c, o, ow - c); break;
            default: break;
            }
#endif
        }
    }
}
#endif
/* the common kernels with their taps known to the compiler, so the sums unroll over them */
static void tf_plane_taps_f32(const float *restrict x, int64_t chans, int64_t ih, int64_t iw,
        const float *restrict w, int64_t kh, int64_t kw, int64_t sy, int64_t sx, int64_t dy, int64_t dx,
        int64_t top, int64_t left, int64_t row0, int64_t rows, int64_t ow, float *restrict out, int64_t ldo) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    if (kh == 3 && kw == 3 && dy == 1 && dx == 1 && sx == 1 && sy == 1)
        tf_plane_direct_body(x, chans, ih, iw, w, 3, 3, top, left, row0, rows, ow, out, ldo);
    else if (kh == 5 && kw == 5 && dy == 1 && dx == 1 && sx == 1 && sy == 1)
        tf_plane_direct_body(x, chans, ih, iw, w, 5, 5, top, left, row0, rows, ow, out, ldo);
    else if (kh == 7 && kw == 7 && dy == 1 && dx == 1 && sx == 1 && sy == 1)  /* (ConvNeXt's) */
        tf_plane_direct_body(x, chans, ih, iw, w, 7, 7, top, left, row0, rows, ow, out, ldo);
    else if (dy == 1 && dx == 1 && sx == 1 && sy == 1)
        tf_plane_direct_body(x, chans, ih, iw, w, kh, kw, top, left, row0, rows, ow, out, ldo);
    else
#endif
    if (kh == 3 && kw == 3 && dy == 1 && dx == 1 && sx == 1)
        tf_plane_taps_body(x, chans, ih, iw, w, 3, 3, sy, 1, 1, 1, top, left, row0, rows, ow, out, ldo);
    else if (kh == 3 && kw == 3 && dy == 1 && dx == 1 && sx == 2)
        tf_plane_taps_body(x, chans, ih, iw, w, 3, 3, sy, 2, 1, 1, top, left, row0, rows, ow, out, ldo);
    else if (kh == 5 && kw == 5 && dy == 1 && dx == 1 && sx == 1)
        tf_plane_taps_body(x, chans, ih, iw, w, 5, 5, sy, 1, 1, 1, top, left, row0, rows, ow, out, ldo);
    else if (kh == 5 && kw == 5 && dy == 1 && dx == 1 && sx == 2)
        tf_plane_taps_body(x, chans, ih, iw, w, 5, 5, sy, 2, 1, 1, top, left, row0, rows, ow, out, ldo);
    else
        tf_plane_taps_body(x, chans, ih, iw, w, kh, kw, sy, sx, dy, dx, top, left, row0, rows, ow, out, ldo);
}
"""
