/* Vectorised lanes over rows of logits, shared by the vocabulary-wide kernels (native_logprobs.c, the training
   forward's; native_sampler.c, the decode's): a row's logits loaded as x = logit / T (bf16 widened exactly, or fp32),
   LANES at a time, the last LANES of a row masked; exp of x - m <= 0; stores of fp32 or bf16 (rounded to nearest even
   as torch's cast, a NaN as 0xffff); lane sums. With AVX-512 as intrinsics (fused multiply-adds, scalef), elsewhere
   with GCC's vector extensions in whatever registers the build's -march has (no fusing: kernels build with
   -ffp-contract=off, rlvr.models.native_build). Every lane of a row goes through the same vector code, so a value
   depends on its row alone.

   exp is Cephes' expf (a degree-5 polynomial on [-ln2/2, ln2/2] times 2^n, within 2 ulp); inputs at or below CUT
   (e^CUT = e x the smallest normal float) give 0, as rlvr.algo.exp_flushed flushes them: no subnormal reaches the
   arithmetic (a subnormal result costs 40-140x a normal one on x86). Each row is fetched ahead in software
   (fetch_ahead). */

#ifndef RLVR_NATIVE_LANES_H
#define RLVR_NATIVE_LANES_H

#include "native_common.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AHEAD 2048                   /* bytes of a row fetched ahead of the loops' reads */
#define CUT (-86.3365447504f)        /* log(smallest normal float) + 1: exp at or below it flushed to 0 */
#define BELOW_CUT (-100.0f)          /* x - m of the lanes past a row's end in the sums, and the least x - m that multiplies
                                        an exp (0 there): a masked token's -inf adds 0 log 0 = 0 to the entropy, not NaN */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f          /* ln 2 in two parts, the first with few bits: n x LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f)
#define ROUNDER 12582912.0f          /* 1.5 x 2^23: (t + ROUNDER) - ROUNDER rounds t to the nearest integer */
#define P0 1.9875691500e-4f          /* Cephes' expf polynomial */
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

#pragma GCC diagnostic ignored "-Wpsabi" /* vectors wider than the build's registers: all inlined, no call passes one */
#define INLINE static inline __attribute__((always_inline)) /* every helper: the flags constant, vectors in registers */

/* ---------------------------------------------------------------------------------------------------------------
   the lanes: vec, load(row, j, n, ...) (logits j .. j + n - 1 as x = logit / T, lanes past n `fill`), exp_lanes,
   store(out, j, n, d), lane sums */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define LANES 16 /* floats per vector: one AVX-512 register */
typedef __m512 vec;

INLINE vec splat(float f) { return _mm512_set1_ps(f); }
INLINE float first(vec v) { return _mm512_cvtss_f32(v); }
INLINE __mmask16 mask_of(int64_t n) { return (__mmask16)((1u << n) - 1u); }

INLINE vec load(const void *row, int64_t j, int64_t n, int bf16, int scaled, float T, float fill) {
    __mmask16 k = mask_of(n);
    vec x = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                       _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, (const uint16_t *)row + j)), 16))
                 : _mm512_maskz_loadu_ps(k, (const float *)row + j);
    if (scaled) x = _mm512_div_ps(x, splat(T));
    return n == LANES ? x : _mm512_mask_blend_ps(k, splat(fill), x);
}

INLINE vec exp_lanes(vec s) {
    vec c = _mm512_max_ps(splat(CUT), s); /* a NaN stays s */
    vec n = _mm512_roundscale_ps(_mm512_mul_ps(c, splat(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec r = _mm512_fnmadd_ps(n, splat(LN2_HI), c);
    r = _mm512_fnmadd_ps(n, splat(LN2_LO), r);
    vec p = _mm512_fmadd_ps(splat(P0), r, splat(P1));
    p = _mm512_fmadd_ps(p, r, splat(P2));
    p = _mm512_fmadd_ps(p, r, splat(P3));
    p = _mm512_fmadd_ps(p, r, splat(P4));
    p = _mm512_fmadd_ps(p, r, splat(P5));
    vec y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), splat(1.0f));
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(s, splat(CUT), _CMP_NLE_UQ), y, n); /* y 2^n, 0 at or below CUT */
}

INLINE void store(void *out, int64_t j, int64_t n, vec d, int bf16) {
    __mmask16 k = mask_of(n);
    if (!bf16) {
        _mm512_mask_storeu_ps((float *)out + j, k, d);
        return;
    }
    __m512i u = _mm512_castps_si512(d);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q), _mm512_set1_epi32(0xffff));
    _mm256_mask_storeu_epi16((uint16_t *)out + j, k, _mm512_cvtepi32_epi16(r));
}

INLINE vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
INLINE vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
INLINE vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
INLINE vec max_lanes(vec a, vec b) { return _mm512_max_ps(a, b); }
INLINE float max_of(vec v) { return _mm512_reduce_max_ps(v); }
INLINE float sum_of(vec v) { return _mm512_reduce_add_ps(v); }

typedef struct { __m512d lo, hi; } dlanes;
INLINE dlanes dzero(void) { return (dlanes){_mm512_setzero_pd(), _mm512_setzero_pd()}; }
INLINE dlanes dadd(dlanes a, vec f) {
    return (dlanes){_mm512_add_pd(a.lo, _mm512_cvtps_pd(_mm512_castps512_ps256(f))),
                    _mm512_add_pd(a.hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))))};
}
INLINE double dsum(dlanes a) {
    double l[LANES];
    _mm512_storeu_pd(l, a.lo);
    _mm512_storeu_pd(l + 8, a.hi);
    double t = 0.0;
    for (int i = 0; i < LANES; ++i) t += l[i];
    return t;
}

#else /* GCC's vector extensions: AVX2, SSE or another architecture's registers */
#define LANES 8 /* one AVX2 register, two SSE ones (sixteen lanes as two AVX2 registers: GCC splits some operations
                   lane by lane, 5x slower) */
typedef float vec __attribute__((vector_size(4 * LANES)));
typedef int32_t vint __attribute__((vector_size(4 * LANES)));
typedef uint32_t vuint __attribute__((vector_size(4 * LANES)));
typedef uint16_t vhalf __attribute__((vector_size(2 * LANES)));
typedef double vdouble __attribute__((vector_size(8 * LANES)));

INLINE vec splat(float f) { return (vec){} + f; }
INLINE float first(vec v) { return v[0]; }
INLINE vec lanes_where(vint k, vec a, vec b) { return (vec)(((vint)a & k) | ((vint)b & ~k)); } /* a where k, else b (not `select`: <stdlib.h> declares that) */

INLINE vec load(const void *row, int64_t j, int64_t n, int bf16, int scaled, float T, float fill) {
    vec x;
    if (n == LANES && bf16) {
        vhalf h;
        memcpy(&h, (const uint16_t *)row + j, sizeof h);
        x = (vec)(__builtin_convertvector(h, vuint) << 16);
    } else if (n == LANES) {
        memcpy(&x, (const float *)row + j, sizeof x);
    } else { /* the last LANES of a row, through arrays: a vector indexed by lane would live in memory throughout */
        float lane[LANES];
        for (int i = 0; i < LANES; ++i)
            lane[i] = i >= n ? 0.0f : bf16 ? rlvr_widen_bf16(((const uint16_t *)row)[j + i]) : ((const float *)row)[j + i];
        memcpy(&x, lane, sizeof x);
    }
    if (scaled) x = x / T;
    if (n == LANES) return x;
    int32_t past[LANES];
    for (int i = 0; i < LANES; ++i) past[i] = i >= n ? -1 : 0;
    vint k;
    memcpy(&k, past, sizeof k);
    return lanes_where(k, splat(fill), x);
}

INLINE vec exp_lanes(vec s) {
    vec c = lanes_where(s < CUT, splat(CUT), s); /* a NaN stays s */
    vec n = (c * LOG2E + ROUNDER) - ROUNDER;
    vec r = c - n * LN2_HI;
    r = r - n * LN2_LO;
    vec p = splat(P0);
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    vec y = (p * (r * r) + r) + 1.0f;
    vec scale = (vec)((__builtin_convertvector(n, vint) + 127) << 23); /* 2^n: n >= -125 above CUT, a normal float */
    return (vec)((vint)(y * scale) & ~(s <= CUT));
}

/* a whole vector through a memcpy of constant size (one store), the last lanes of a row through one of n (a call) */
INLINE void store(void *out, int64_t j, int64_t n, vec d, int bf16) {
    if (!bf16) {
        if (n == LANES)
            memcpy((float *)out + j, &d, sizeof d);
        else
            memcpy((float *)out + j, &d, (size_t)n * sizeof(float));
        return;
    }
    vuint u = (vuint)d;
    vuint rounded = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) | ((vuint)(d != d) & 0xffffu); /* a NaN: 0xffff */
    vhalf h = __builtin_convertvector(rounded, vhalf);
    if (n == LANES)
        memcpy((uint16_t *)out + j, &h, sizeof h);
    else
        memcpy((uint16_t *)out + j, &h, (size_t)n * sizeof(uint16_t));
}

INLINE vec add(vec a, vec b) { return a + b; }
INLINE vec sub(vec a, vec b) { return a - b; }
INLINE vec mul(vec a, vec b) { return a * b; }
INLINE vec max_lanes(vec a, vec b) { return lanes_where(a > b, a, b); }
INLINE float max_of(vec v) {
    float m = v[0];
    for (int i = 1; i < LANES; ++i) m = v[i] > m ? v[i] : m;
    return m;
}
INLINE float sum_of(vec v) {
    float t = v[0];
    for (int i = 1; i < LANES; ++i) t += v[i];
    return t;
}

typedef vdouble dlanes;
INLINE dlanes dzero(void) { return (dlanes){}; }
INLINE dlanes dadd(dlanes a, vec f) { return a + __builtin_convertvector(f, vdouble); }
INLINE double dsum(dlanes a) {
    double t = 0.0;
    for (int i = 0; i < LANES; ++i) t += a[i];
    return t;
}
#endif

INLINE int64_t lanes_at(int64_t V, int64_t j) { return V - j < LANES ? V - j : LANES; }

/* the row's bytes AHEAD past logit j fetched into the cache, one line per 64 bytes of logits read: without it these
   loops wait on memory (a backward pass took 3x as long as a plain bf16 pass over the same bytes, with it as long) */
INLINE void fetch_ahead(const void *row, int64_t j, int bf16) {
    int64_t byte = j * (bf16 ? 2 : 4);
    if (byte % 64 < LANES * (bf16 ? 2 : 4)) __builtin_prefetch((const char *)row + byte + AHEAD, 1);
}

INLINE float row_max(const void *row, int64_t V, int bf16, int scaled, float T) {
    vec acc = splat(-INFINITY);
    for (int64_t j = 0; j < V; j += LANES) {
        fetch_ahead(row, j, bf16);
        acc = max_lanes(acc, load(row, j, lanes_at(V, j), bf16, scaled, T, -INFINITY));
    }
    return max_of(acc);
}

/* the bits of the build's vectors: 512 with AVX-512, 256 with AVX2 (x86), else 0 (SSE or another architecture: GCC
   splits the vectors there, slower than torch's own ops; native_logprobs.py keeps torch's path) */
INLINE int lanes_vector_bits(void) {
#if LANES == 16
    return 512;
#elif defined(__AVX2__)
    return 256;
#else
    return 0;
#endif
}

#endif
