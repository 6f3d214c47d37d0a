/* The training forward's per-token log-probs and entropies over the vocabulary, and their backward, each one pass per
   token row straight from the logits (native_logprobs.py builds and calls this file; the math is
   rlvr.algo.logprobs.token_logprobs's):

   forward   x = logit / T (fp32)   m = max x   e = exp(x - m)   Z = sum e
             logp = x[index] - (log Z + m)        H = log Z - sum(e (x - m)) / Z
   backward  d_j = -p_j c_j + [j = index] g        p_j = e_j / Z,  c_j = g  (+ gh (log p_j + H) with an entropy gradient)
             with g, gh the upstream gradients over T; the gradient written as bf16 (rounded to nearest even, as
             torch's cast, a NaN as 0xffff) or fp32, over the logits themselves where the caller says they are its
             temporary.

   torch's ops make six passes over each chunk of a fp32 copy of the logits forward and three to four backward; here the
   forward reads each row twice (the max, then exp and both sums, from the cache) and the backward once, writing the
   gradient in the logits' dtype. One thread owns each token row and every lane of a row goes through the same vector
   code (the last LANES masked), so a row's values depend on nothing but the row: not the thread count, not which rows
   share a call. The no-gradient pass that gives a step's old log-probs and the training pass give the same bits, and
   the ratio starts at exactly 1.

   exp is this file's own (Cephes' expf: a degree-5 polynomial on [-ln2/2, ln2/2] times 2^n, within 2 ulp), vectorised:
   with AVX-512 as intrinsics (fused multiply-adds, scalef), elsewhere with GCC's vector extensions in whatever
   registers the build's -march has (no fusing: built with -ffp-contract=off, rlvr.models.native_build). Inputs are
   x - m <= 0, and those at or below CUT (e^CUT = e x the smallest normal float) give 0, as rlvr.algo.exp_flushed
   flushes them: no subnormal reaches the arithmetic (a subnormal result costs 40-140x a normal one on x86). The sums
   run in LANES float lanes per block of BLOCK values, each block added into double lanes: the float error of a sum is
   that of BLOCK / LANES terms at any vocabulary. Each row is fetched ahead in software (fetch_ahead). */

#include "native_common.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 512                    /* values per block of float sums */
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
INLINE vec select(vint k, vec a, vec b) { return (vec)(((vint)a & k) | ((vint)b & ~k)); } /* a where k, else b */

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
    return select(k, splat(fill), x);
}

INLINE vec exp_lanes(vec s) {
    vec c = select(s < CUT, splat(CUT), s); /* a NaN stays s */
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

INLINE void store(void *out, int64_t j, int64_t n, vec d, int bf16) {
    if (!bf16) {
        memcpy((float *)out + j, &d, (size_t)n * sizeof(float));
        return;
    }
    vuint u = (vuint)d;
    vuint rounded = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) | ((vuint)(d != d) & 0xffffu); /* a NaN: 0xffff */
    vhalf h = __builtin_convertvector(rounded, vhalf);
    memcpy((uint16_t *)out + j, &h, (size_t)n * sizeof(uint16_t));
}

INLINE vec add(vec a, vec b) { return a + b; }
INLINE vec sub(vec a, vec b) { return a - b; }
INLINE vec mul(vec a, vec b) { return a * b; }
INLINE vec max_lanes(vec a, vec b) { return select(a > b, a, b); }
INLINE float max_of(vec v) {
    float m = v[0];
    for (int i = 1; i < LANES; ++i) m = v[i] > m ? v[i] : m;
    return m;
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

/* ---------------------------------------------------------------------------------------------------------------
   one row: bf16 and scaled are constants where these are inlined, each combination its own loops */

INLINE float row_max(const void *row, int64_t V, int bf16, int scaled, float T) {
    vec acc = splat(-INFINITY);
    for (int64_t j = 0; j < V; j += LANES) {
        fetch_ahead(row, j, bf16);
        acc = max_lanes(acc, load(row, j, lanes_at(V, j), bf16, scaled, T, -INFINITY));
    }
    return max_of(acc);
}

/* (Z, sum e (x - m)) of a row, the second 0 without with_entropy */
INLINE void row_sums(const void *row, int64_t V, int bf16, int scaled, float T, float m,
                                                           int with_entropy, double *z, double *es) {
    dlanes zd = dzero(), ed = dzero();
    vec mv = splat(m);
    for (int64_t j = 0; j < V;) {
        vec zf = splat(0.0f), ef = splat(0.0f);
        for (int64_t end = j + BLOCK < V ? j + BLOCK : V; j < end; j += LANES) {
            vec s = sub(load(row, j, lanes_at(V, j), bf16, scaled, T, BELOW_CUT + m), mv);
            vec e = exp_lanes(s);
            zf = add(zf, e);
            if (with_entropy) ef = add(ef, mul(e, max_lanes(s, splat(BELOW_CUT)))); /* e 0 at s = -inf: 0, not NaN */
        }
        zd = dadd(zd, zf);
        ed = dadd(ed, ef);
    }
    *z = dsum(zd);
    *es = dsum(ed);
}

INLINE void forward_row(const void *row, int64_t V, int bf16, int scaled, float T,
                                                              int64_t index, int with_entropy, float *m_out, float *log_z_out,
                                                              float *logp_out, float *entropy_out) {
    float m = row_max(row, V, bf16, scaled, T);
    double z, es;
    row_sums(row, V, bf16, scaled, T, m, with_entropy, &z, &es);
    float log_z = (float)log(z);
    *m_out = m;
    *log_z_out = log_z;
    *logp_out = first(load(row, index, 1, bf16, scaled, T, 0.0f)) - (log_z + m);
    if (with_entropy) *entropy_out = (float)(log(z) - es / z);
}

/* d of LANES values s = x - m: -(e / Z) (g + gh (log p + H)) with an entropy gradient, else e (-g / Z) */
INLINE vec row_grad(vec s, int entropy_grad, vec neg_g_over_z, vec z_inv, vec g, vec gh, vec log_z, vec H) {
    vec e = exp_lanes(s);
    if (!entropy_grad) return mul(e, neg_g_over_z);
    vec coef = add(g, mul(gh, add(sub(max_lanes(s, splat(BELOW_CUT)), log_z), H))); /* finite at s = -inf, where e is 0 */
    return sub(splat(0.0f), mul(mul(e, z_inv), coef));
}

/* d_j of one row into out (bf16 or fp32; may be the row itself: each LANES are read before they are written) */
INLINE void backward_row(const void *row, void *out, int64_t V, int bf16, int scaled,
                                                               float T, float m, float log_z, float g, float gh, float H,
                                                               int entropy_grad, int64_t index) {
    vec mv = splat(m), gv = splat(g), ghv = splat(gh), lzv = splat(log_z), Hv = splat(H);
    vec z_inv = splat((float)exp(-(double)log_z)), neg_g_over_z = splat((float)(-(double)g * exp(-(double)log_z)));
    vec picked = sub(load(row, index, 1, bf16, scaled, T, 0.0f), mv); /* read before the row is written over */
    for (int64_t j = 0; j < V; j += LANES) {
        fetch_ahead(row, j, bf16);
        int64_t n = lanes_at(V, j);
        vec s = sub(load(row, j, n, bf16, scaled, T, 0.0f), mv);
        store(out, j, n, row_grad(s, entropy_grad, neg_g_over_z, z_inv, gv, ghv, lzv, Hv), bf16);
    }
    vec d = add(row_grad(picked, entropy_grad, neg_g_over_z, z_inv, gv, ghv, lzv, Hv), gv); /* its lane 0 the index's */
    store(out, index, 1, d, bf16);
}

/* ---------------------------------------------------------------------------------------------------------------
   the calls: rows split over the threads */

/* the bits of the build's vectors: 512 with AVX-512, 256 with AVX2 (x86), else 0 (SSE or another architecture: GCC
   splits the vectors there, slower than torch's own ops; native_logprobs.py keeps torch's path) */
int rlvr_token_logprobs_vector_bits(void) {
#if LANES == 16
    return 512;
#elif defined(__AVX2__)
    return 256;
#else
    return 0;
#endif
}

static int threads_for(int64_t tokens, int64_t V, int threads) { return tokens * V >= (1 << 16) ? threads : 1; }

/* logits: token (n, l) of [N, L] at logits + n s0 + l s1 (elements, bf16 or fp32), V contiguous; index [N, L]
   (each in [0, V)); m, log_z, logp, entropy (or NULL) [N, L] floats, contiguous */
void rlvr_token_logprobs(const void *logits, int bf16, int64_t s0, int64_t s1, int64_t N, int64_t L, int64_t V,
                         const int64_t *index, float T, float *m, float *log_z, float *logp, float *entropy, int threads) {
    int scaled = T != 1.0f, with_entropy = entropy != NULL;
    int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads_for(N * L, V, threads)) schedule(static)
    for (int64_t t = 0; t < N * L; ++t) {
        const char *row = (const char *)logits + ((t / L) * s0 + (t % L) * s1) * size;
        float *e = with_entropy ? entropy + t : NULL;
        if (bf16 && !scaled) forward_row(row, V, 1, 0, 1.0f, index[t], with_entropy, m + t, log_z + t, logp + t, e);
        else if (bf16) forward_row(row, V, 1, 1, T, index[t], with_entropy, m + t, log_z + t, logp + t, e);
        else if (!scaled) forward_row(row, V, 0, 0, 1.0f, index[t], with_entropy, m + t, log_z + t, logp + t, e);
        else forward_row(row, V, 0, 1, T, index[t], with_entropy, m + t, log_z + t, logp + t, e);
    }
}

/* logits as above; grad the same shape at grad + n gs0 + l gs1 in the logits' dtype (may be the logits); m, log_z,
   index [N, L] from the forward; g [N, L] the log-probs' gradient over T; gh [N, L] the entropies' over T and
   entropy [N, L] the forward's, or both NULL */
void rlvr_token_logprobs_backward(const void *logits, int bf16, int64_t s0, int64_t s1, void *grad, int64_t gs0, int64_t gs1,
                                  int64_t N, int64_t L, int64_t V, const int64_t *index, float T, const float *m,
                                  const float *log_z, const float *g, const float *gh, const float *entropy, int threads) {
    int scaled = T != 1.0f;
    int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads_for(N * L, V, threads)) schedule(static)
    for (int64_t t = 0; t < N * L; ++t) {
        int64_t n = t / L, l = t % L;
        const char *row = (const char *)logits + (n * s0 + l * s1) * size;
        char *out = (char *)grad + (n * gs0 + l * gs1) * size;
        float ght = gh ? gh[t] : 0.0f, H = gh ? entropy[t] : 0.0f;
        if (gh) backward_row(row, out, V, bf16, scaled, T, m[t], log_z[t], g[t], ght, H, 1, index[t]);
        else if (bf16 && !scaled) backward_row(row, out, V, 1, 0, 1.0f, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
        else if (bf16) backward_row(row, out, V, 1, 1, T, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
        else if (!scaled) backward_row(row, out, V, 0, 0, 1.0f, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
        else backward_row(row, out, V, 0, 1, T, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
    }
}
