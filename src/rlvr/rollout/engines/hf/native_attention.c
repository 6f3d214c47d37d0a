/* The lean decode's attention over its KV buffers in one pass (native_attention.py builds and calls this file).

   For each (row, kv head) and its R queries (R = query heads per kv head): the scores q k_s x scale + bias_s over slots
   0..L-1 (a slot whose bias is -inf is skipped, its keys and values not read), their softmax, and sum_s p_s v_s, with
   each query's log-sum-exp. Every key and value is read once, as floats or as bf16 widened to floats; the sums run in
   float. On the CPU the decode's two batched products read the buffers at about half the memory's rate and could not
   skip the slots not yet written; this reads at about its rate (bench/results/decode_native_attention_amx.md).

   Plain C with OpenMP, no torch headers: built once per machine with -march=native and linked to the OpenMP runtime
   torch itself loaded (libgomp), so its threads are torch's. */

#include "native_common.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float widen_f32(const float *p, int64_t i) { return p[i]; }

static inline float widen_bf16(const uint16_t *p, int64_t i) { return rlvr_widen_bf16(p[i]); }

/* q [D] . k [D] with 16 partial sums (vectorised without reassociating a single sum) */
#define DEFINE_DOT(NAME, T, WIDEN)                                                                 \
    static inline float NAME(const float *restrict q, const T *restrict k, int64_t D) {            \
        float acc[16] = {0};                                                                       \
        int64_t d = 0;                                                                             \
        for (; d + 16 <= D; d += 16)                                                               \
            for (int j = 0; j < 16; ++j) acc[j] += q[d + j] * WIDEN(k, d + j);                    \
        float tail = 0.f;                                                                          \
        for (; d < D; ++d) tail += q[d] * WIDEN(k, d);                                             \
        for (int j = 0; j < 8; ++j) acc[j] += acc[j + 8];                                          \
        for (int j = 0; j < 4; ++j) acc[j] += acc[j + 4];                                          \
        return tail + (acc[0] + acc[2]) + (acc[1] + acc[3]);                                       \
    }

/* the kernels' arguments (described below) and a call passing them on */
#define ATTEND_ARGS(T)                                                                                                  \
    const float *q, const T *k, const T *v, int64_t ks0, int64_t ks1, int64_t ks2, int64_t vs0, int64_t vs1,           \
        int64_t vs2, const float *bias, int64_t bias_stride, const int64_t *rows, const int64_t *lengths, float *out,   \
        float *lse, int64_t n, int64_t H, int64_t R, int64_t D, int64_t L, float scale, int threads
#define ATTEND_CALL q, k, v, ks0, ks1, ks2, vs0, vs1, vs2, bias, bias_stride, rows, lengths, out, lse, n, H, R, D, L, scale, threads

/* item b = (query row, head h)'s queries qb, keys kb, values vb, bias bb (or NULL), output ob and slots read Lb: the
   keys, values and bias of buffer row rows[query row] (the query row itself where rows is NULL), its first
   lengths[query row] slots (L where lengths is NULL) */
#define ITEM(T)                                                                                                        \
    int64_t qrow = b / H, h = b % H, row = rows ? rows[qrow] : qrow, Lb = lengths ? lengths[qrow] : L;                  \
    const float *qb = q + b * R * D;                                                                                   \
    const T *kb = k + row * ks0 + h * ks1, *vb = v + row * vs0 + h * vs1;                                              \
    const float *bb = bias ? bias + row * bias_stride : NULL;                                                          \
    float *ob = out + b * R * D;

/* q [n, H, R, D] floats, contiguous; k, v [n, H, S, D] with strides (row, head, slot) in elements and D contiguous;
   bias [n or 1, S] floats (row stride bias_stride, 0 for one row shared by all) or NULL; rows [n]: the buffer row
   (of k, v and bias) each query row reads, or NULL (its own); lengths [n]: the slots each query row reads (1..L), or
   NULL (L each); out [n, H, R, D] and lse [n, H, R] floats, contiguous; slots 0..L-1 read; threads: torch's thread
   count */
#define DEFINE_ATTEND(NAME, T, DOT, WIDEN)                                                                              \
    static void NAME(ATTEND_ARGS(T)) {                                                                                  \
        _Pragma("omp parallel num_threads(threads)") {                                                                  \
            float *scores = malloc(sizeof(float) * (size_t)(R * (L > 0 ? L : 1)));                                      \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < n * H; ++b) {                                   \
                ITEM(T)                                                                                                 \
                for (int64_t s = 0; s < Lb; ++s) {                                                                       \
                    float add = bb ? bb[s] : 0.f;                                                                       \
                    for (int64_t r = 0; r < R; ++r)                                                                     \
                        scores[r * L + s] = isinf(add) && add < 0 ? add : DOT(qb + r * D, kb + s * ks2, D) * scale + add; \
                }                                                                                                       \
                for (int64_t r = 0; r < R; ++r) {                                                                       \
                    float *sr = scores + r * L, top = -INFINITY, sum = 0.f;                                             \
                    for (int64_t s = 0; s < Lb; ++s) top = sr[s] > top ? sr[s] : top;                                   \
                    for (int64_t s = 0; s < Lb; ++s) {                                                                   \
                        sr[s] = expf(sr[s] - top);                                                                      \
                        sum += sr[s];                                                                                   \
                    }                                                                                                   \
                    for (int64_t s = 0; s < Lb; ++s) sr[s] /= sum;                                                       \
                    lse[b * R + r] = top + logf(sum);                                                                   \
                    memset(ob + r * D, 0, sizeof(float) * (size_t)D);                                                   \
                }                                                                                                       \
                for (int64_t s = 0; s < Lb; ++s) {                                                                       \
                    if (bb && isinf(bb[s]) && bb[s] < 0) continue;                                                      \
                    const T *vs = vb + s * vs2;                                                                         \
                    for (int64_t r = 0; r < R; ++r) {                                                                   \
                        float w = scores[r * L + s], *o = ob + r * D;                                                   \
                        for (int64_t d = 0; d < D; ++d) o[d] += w * WIDEN(vs, d);                                       \
                    }                                                                                                   \
                }                                                                                                       \
            }                                                                                                           \
            free(scores);                                                                                               \
        }                                                                                                               \
    }

DEFINE_DOT(dot_f32, float, widen_f32)
DEFINE_DOT(dot_bf16, uint16_t, widen_bf16)
DEFINE_ATTEND(generic_f32, float, dot_f32, widen_f32)
DEFINE_ATTEND(generic_bf16, uint16_t, dot_bf16, widen_bf16)

/* a vector path's kernel: heads over W x MAX_CHUNKS floats through GENERIC, the rest item by item through ITEM_FN
   (vectors of W floats), its count of vectors a constant for the common heads (the loops over them unroll: D 32, 40,
   64, 128 with W 8; 64, 80, 128, 256 with W 16) */
#define DEFINE_VECTOR(NAME, T, ITEM_FN, GENERIC, W)                                                                     \
    void NAME(ATTEND_ARGS(T)) {                                                                                         \
        if (D > W * MAX_CHUNKS) {                                                                                       \
            GENERIC(ATTEND_CALL);                                                                                       \
            return;                                                                                                     \
        }                                                                                                               \
        const int64_t chunks = (D + W - 1) / W;                                                                         \
        const int64_t Lp = (L + W - 1) / W * W; /* scores padded to whole vectors, the padding -inf */                 \
        _Pragma("omp parallel num_threads(threads)") {                                                                  \
            float *scores = aligned_alloc(4 * W, sizeof(float) * (size_t)(R * Lp));                                    \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < n * H; ++b) {                                   \
                ITEM(T)                                                                                                 \
                const int64_t Lpb = (Lb + W - 1) / W * W;                                                               \
                if (chunks == 4)                                                                                        \
                    ITEM_FN(qb, kb, ks2, vb, vs2, bb, ob, lse + b * R, R, D, Lb, Lpb, scale, scores, 4);                \
                else if (chunks == 5)                                                                                   \
                    ITEM_FN(qb, kb, ks2, vb, vs2, bb, ob, lse + b * R, R, D, Lb, Lpb, scale, scores, 5);                \
                else if (chunks == 8)                                                                                   \
                    ITEM_FN(qb, kb, ks2, vb, vs2, bb, ob, lse + b * R, R, D, Lb, Lpb, scale, scores, 8);                \
                else if (chunks == 16)                                                                                  \
                    ITEM_FN(qb, kb, ks2, vb, vs2, bb, ob, lse + b * R, R, D, Lb, Lpb, scale, scores, 16);               \
                else                                                                                                    \
                    ITEM_FN(qb, kb, ks2, vb, vs2, bb, ob, lse + b * R, R, D, Lb, Lpb, scale, scores, chunks);           \
            }                                                                                                           \
            free(scores);                                                                                               \
        }                                                                                                               \
    }

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The same with AVX-512: 16 floats a vector, the last one masked (any D); the softmax's exp by a polynomial
   (about 1 ulp; a score 127 below the row's largest weighs exactly 0, as -inf does). */
#include <immintrin.h>

#define MAX_CHUNKS 16 /* vectors of 16 per head (D up to 256) held in registers; more: the generic loop */

static inline __m512 load_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}

/* lane j of the result = the sum of a[j]'s 16 lanes: a transpose and add in three rounds (45 instructions for 16
   sums, where reducing each vector alone takes about 8 dependent ones) */
static inline __m512 sum16(const __m512 *a) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; ++i) /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of the pair's two vectors */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i) { /* per 128-bit lane: the four vectors' sums over that lane */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
}

/* One (row, kv head) item: its R queries' scores over slots 0..L-1 sixteen slots at a time (each key row read once per
   query, the 16 dot products summed together by sum16; a masked slot's score -inf whatever its keys hold), softmax and
   log-sum-exp, then the weighted values with the output held in registers (a masked slot's values not read).
   Inlined with CHUNKS (vectors of 16 per head) a constant for the common head sizes. */
#define DEFINE_ITEM(NAME, T, LOAD)                                                                                      \
    static inline __attribute__((always_inline)) void NAME(const float *qb, const T *kb, int64_t ks2, const T *vb,     \
                                                          int64_t vs2, const float *bb, float *ob, float *lb, int64_t R, \
                                                          int64_t D, int64_t L, int64_t Lp, float scale, float *scores, \
                                                          const int64_t chunks) {                                       \
        const __mmask16 tail = (__mmask16)((1u << (D - (chunks - 1) * 16)) - 1u);                                      \
        const __m512 ninf = _mm512_set1_ps(-INFINITY);                                                                  \
        for (int64_t r = 0; r < R; ++r) {                                                                               \
            __m512 qv[MAX_CHUNKS];                                                                                      \
            for (int64_t c = 0; c < chunks; ++c) qv[c] = load_f32(qb + r * D + c * 16, c == chunks - 1 ? tail : 0xFFFF); \
            float *sr = scores + r * Lp;                                                                                \
            for (int64_t s0 = 0; s0 < L; s0 += 16) {                                                                    \
                int64_t m = L - s0 < 16 ? L - s0 : 16;                                                                  \
                __mmask16 live = (__mmask16)((1u << m) - 1u);                                                           \
                __m512 acc[16];                                                                                         \
                for (int64_t j = 0; j < 16; ++j) {                                                                      \
                    acc[j] = _mm512_setzero_ps();                                                                       \
                    if (j >= m) continue;                                                                               \
                    const T *kr = kb + (s0 + j) * ks2;                                                                  \
                    for (int64_t c = 0; c < chunks; ++c)                                                                \
                        acc[j] = _mm512_fmadd_ps(qv[c], LOAD(kr + c * 16, c == chunks - 1 ? tail : 0xFFFF), acc[j]);    \
                }                                                                                                       \
                __m512 sc = _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale));                                           \
                if (bb) {                                                                                               \
                    __m512 add = _mm512_maskz_loadu_ps(live, bb + s0);                                                  \
                    live &= _mm512_cmp_ps_mask(add, ninf, _CMP_NEQ_OQ);                                                 \
                    sc = _mm512_add_ps(sc, add);                                                                        \
                }                                                                                                       \
                _mm512_store_ps(sr + s0, _mm512_mask_blend_ps(live, ninf, sc));                                         \
            }                                                                                                           \
            __m512 top = ninf, sum = _mm512_setzero_ps(); /* softmax, log-sum-exp */                                  \
            for (int64_t s = 0; s < Lp; s += 16) top = _mm512_max_ps(top, _mm512_load_ps(sr + s));                      \
            float t = _mm512_reduce_max_ps(top);                                                                        \
            __m512 tv = _mm512_set1_ps(t);                                                                              \
            for (int64_t s = 0; s < Lp; s += 16) {                                                                      \
                __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(sr + s), tv));                                           \
                _mm512_store_ps(sr + s, e);                                                                             \
                sum = _mm512_add_ps(sum, e);                                                                            \
            }                                                                                                           \
            float total = _mm512_reduce_add_ps(sum);                                                                    \
            __m512 inv = _mm512_set1_ps(1.f / total);                                                                   \
            for (int64_t s = 0; s < Lp; s += 16) _mm512_store_ps(sr + s, _mm512_mul_ps(_mm512_load_ps(sr + s), inv));   \
            lb[r] = t + logf(total);                                                                                    \
            __m512 o[MAX_CHUNKS]; /* the output: the value rows in slot order, two slots at a time on two sums */     \
            __m512 o2[MAX_CHUNKS];                                                                                      \
            for (int64_t c = 0; c < chunks; ++c) o[c] = o2[c] = _mm512_setzero_ps();                                    \
            int64_t s = 0;                                                                                              \
            if (!bb)                                                                                                    \
                for (; s + 2 <= L; s += 2) {                                                                            \
                    const T *v0 = vb + s * vs2, *v1 = v0 + vs2;                                                         \
                    __m512 w0 = _mm512_set1_ps(sr[s]), w1 = _mm512_set1_ps(sr[s + 1]);                                 \
                    for (int64_t c = 0; c < chunks; ++c) {                                                              \
                        __mmask16 mc = c == chunks - 1 ? tail : 0xFFFF;                                                 \
                        o[c] = _mm512_fmadd_ps(w0, LOAD(v0 + c * 16, mc), o[c]);                                        \
                        o2[c] = _mm512_fmadd_ps(w1, LOAD(v1 + c * 16, mc), o2[c]);                                      \
                    }                                                                                                   \
                }                                                                                                       \
            for (; s < L; ++s) {                                                                                        \
                if (bb && isinf(bb[s]) && bb[s] < 0) continue;                                                          \
                const T *vs = vb + s * vs2;                                                                             \
                __m512 w = _mm512_set1_ps(sr[s]);                                                                       \
                for (int64_t c = 0; c < chunks; ++c) o[c] = _mm512_fmadd_ps(w, LOAD(vs + c * 16, c == chunks - 1 ? tail : 0xFFFF), o[c]); \
            }                                                                                                           \
            for (int64_t c = 0; c < chunks; ++c)                                                                        \
                _mm512_mask_storeu_ps(ob + r * D + c * 16, c == chunks - 1 ? tail : 0xFFFF, _mm512_add_ps(o[c], o2[c])); \
        }                                                                                                               \
    }

DEFINE_ITEM(item_f32, float, load_f32)
DEFINE_ITEM(item_bf16, uint16_t, load_bf16)
DEFINE_VECTOR(rlvr_attend_f32, float, item_f32, generic_f32, 16)
DEFINE_VECTOR(rlvr_attend_bf16, uint16_t, item_bf16, generic_bf16, 16)
#elif defined(__AVX2__) && defined(__FMA__)
/* The same with AVX2 and FMA (the AVX-512 path's structure): 8 floats a vector, the last one of a head masked (any D),
   eight slots' dot products summed together by sum8, the softmax's exp by the same polynomial (a score more than 86
   below the row's largest weighs exactly 0, as -inf does). On an AMD EPYC without AVX-512 the generic loops took
   1.1 ms a layer of config B's decode (64 rows, 8 heads of 64), about 13 % of its generation. */
#include <immintrin.h>

#define MAX_CHUNKS 32 /* vectors of 8 per head (D up to 256); more: the generic loop */
#define EXP_CUT (-86.3365447504f) /* log(smallest normal float) + 1: exp below it is 0 (2^n stays a normal float) */

static inline __m256i lanes_below(int64_t n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }

/* the first n (1..8) floats at p, the lanes past n 0 (not read) */
static inline __m256 load8_f32(const float *p, int64_t n, __m256i m) { return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m); }

static inline __m256 load8_bf16(const uint16_t *p, int64_t n, __m256i m) {
    (void)m;
    __m128i h;
    if (n == 8)
        h = _mm_loadu_si128((const __m128i *)p);
    else {
        uint16_t part[8] = {0};
        memcpy(part, p, sizeof(uint16_t) * (size_t)n);
        h = _mm_loadu_si128((const __m128i *)part);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256 exp256(__m256 x) {
    __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_CUT), _CMP_LT_OQ); /* -inf too; a NaN stays NaN */
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_CUT));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)));
}

/* lane j of the result = the sum of a[j]'s 8 lanes (pairwise adds across the eight vectors) */
static inline __m256 sum8(const __m256 *a) {
    __m256 c0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3])); /* a0..a3: lanes 0-3 | 4-7 */
    __m256 c1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

static inline float max8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float add8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* One (row, kv head) item, as the AVX-512 path's: scores eight slots at a time, softmax and log-sum-exp, then the
   weighted values with the output in registers (two slots at a time on two sums where no slot is masked). */
#define DEFINE_ITEM(NAME, T, LOAD)                                                                                      \
    static inline __attribute__((always_inline)) void NAME(const float *qb, const T *kb, int64_t ks2, const T *vb,     \
                                                          int64_t vs2, const float *bb, float *ob, float *lb, int64_t R, \
                                                          int64_t D, int64_t L, int64_t Lp, float scale, float *scores, \
                                                          const int64_t chunks) {                                       \
        const int64_t last = D - (chunks - 1) * 8; /* lanes of the head's last vector */                               \
        const __m256i tail = lanes_below(last);                                                                         \
        const __m256 ninf = _mm256_set1_ps(-INFINITY);                                                                  \
        for (int64_t r = 0; r < R; ++r) {                                                                               \
            __m256 qv[MAX_CHUNKS];                                                                                      \
            for (int64_t c = 0; c < chunks; ++c) qv[c] = load8_f32(qb + r * D + c * 8, c == chunks - 1 ? last : 8, tail); \
            float *sr = scores + r * Lp;                                                                                \
            for (int64_t s0 = 0; s0 < L; s0 += 8) {                                                                     \
                int64_t m = L - s0 < 8 ? L - s0 : 8;                                                                    \
                __m256 acc[8];                                                                                          \
                for (int64_t j = 0; j < 8; ++j) {                                                                       \
                    acc[j] = _mm256_setzero_ps();                                                                       \
                    if (j >= m) continue;                                                                               \
                    const T *kr = kb + (s0 + j) * ks2;                                                                  \
                    for (int64_t c = 0; c < chunks; ++c)                                                                \
                        acc[j] = _mm256_fmadd_ps(qv[c], LOAD(kr + c * 8, c == chunks - 1 ? last : 8, tail), acc[j]);    \
                }                                                                                                       \
                __m256 sc = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale));                                            \
                __m256 live = _mm256_castsi256_ps(lanes_below(m));                                                      \
                if (bb) {                                                                                               \
                    __m256 add = _mm256_maskload_ps(bb + s0, _mm256_castps_si256(live));                                \
                    live = _mm256_and_ps(live, _mm256_cmp_ps(add, ninf, _CMP_NEQ_OQ));                                  \
                    sc = _mm256_add_ps(sc, add);                                                                        \
                }                                                                                                       \
                _mm256_store_ps(sr + s0, _mm256_blendv_ps(ninf, sc, live));                                             \
            }                                                                                                           \
            __m256 top = ninf, sum = _mm256_setzero_ps(); /* softmax, log-sum-exp */                                  \
            for (int64_t s = 0; s < Lp; s += 8) top = _mm256_max_ps(top, _mm256_load_ps(sr + s));                        \
            float t = max8(top);                                                                                        \
            __m256 tv = _mm256_set1_ps(t);                                                                              \
            for (int64_t s = 0; s < Lp; s += 8) {                                                                       \
                __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(sr + s), tv));                                           \
                _mm256_store_ps(sr + s, e);                                                                             \
                sum = _mm256_add_ps(sum, e);                                                                            \
            }                                                                                                           \
            float total = add8(sum);                                                                                    \
            __m256 inv = _mm256_set1_ps(1.f / total);                                                                   \
            for (int64_t s = 0; s < Lp; s += 8) _mm256_store_ps(sr + s, _mm256_mul_ps(_mm256_load_ps(sr + s), inv));     \
            lb[r] = t + logf(total);                                                                                    \
            __m256 o[MAX_CHUNKS], o2[MAX_CHUNKS]; /* the output: the value rows in slot order, two slots on two sums */ \
            for (int64_t c = 0; c < chunks; ++c) o[c] = o2[c] = _mm256_setzero_ps();                                    \
            int64_t s = 0;                                                                                              \
            if (!bb)                                                                                                    \
                for (; s + 2 <= L; s += 2) {                                                                            \
                    const T *v0 = vb + s * vs2, *v1 = v0 + vs2;                                                         \
                    __m256 w0 = _mm256_set1_ps(sr[s]), w1 = _mm256_set1_ps(sr[s + 1]);                                 \
                    for (int64_t c = 0; c < chunks; ++c) {                                                              \
                        int64_t nc = c == chunks - 1 ? last : 8;                                                        \
                        o[c] = _mm256_fmadd_ps(w0, LOAD(v0 + c * 8, nc, tail), o[c]);                                   \
                        o2[c] = _mm256_fmadd_ps(w1, LOAD(v1 + c * 8, nc, tail), o2[c]);                                 \
                    }                                                                                                   \
                }                                                                                                       \
            for (; s < L; ++s) {                                                                                        \
                if (bb && isinf(bb[s]) && bb[s] < 0) continue;                                                          \
                const T *vs = vb + s * vs2;                                                                             \
                __m256 w = _mm256_set1_ps(sr[s]);                                                                       \
                for (int64_t c = 0; c < chunks; ++c) o[c] = _mm256_fmadd_ps(w, LOAD(vs + c * 8, c == chunks - 1 ? last : 8, tail), o[c]); \
            }                                                                                                           \
            for (int64_t c = 0; c < chunks; ++c) {                                                                      \
                __m256 sum_c = _mm256_add_ps(o[c], o2[c]);                                                              \
                if (c == chunks - 1 && last < 8)                                                                        \
                    _mm256_maskstore_ps(ob + r * D + c * 8, tail, sum_c);                                               \
                else                                                                                                    \
                    _mm256_storeu_ps(ob + r * D + c * 8, sum_c);                                                        \
            }                                                                                                           \
        }                                                                                                               \
    }

DEFINE_ITEM(item_f32, float, load8_f32)
DEFINE_ITEM(item_bf16, uint16_t, load8_bf16)
DEFINE_VECTOR(rlvr_attend_f32, float, item_f32, generic_f32, 8)
DEFINE_VECTOR(rlvr_attend_bf16, uint16_t, item_bf16, generic_bf16, 8)
#else
#define FORWARD(NAME, T, GENERIC)                                                                                       \
    void NAME(ATTEND_ARGS(T)) {                                                                                         \
        GENERIC(ATTEND_CALL);     \
    }
FORWARD(rlvr_attend_f32, float, generic_f32)
FORWARD(rlvr_attend_bf16, uint16_t, generic_bf16)
#endif
