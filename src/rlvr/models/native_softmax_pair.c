/* softmax over rows split in two buffers, and its backward, in place (native_softmax_pair.py builds and calls this
   file; prefix_attention's grouped products use it where it builds).

   forward   p = softmax([a + mask | b + bias]) per row, written back over a and b (mask: a group's left padding)
   backward  ds = p (dp - sum(dp p)) per row, written back over dp's two parts

   a [rows, P] and b [rows, C], each contiguous, row r of a and row r of b one row of P + C scores: the completions'
   scores over their group's prompt keys and over their own keys. One softmax over the concatenated scores in torch
   needs them in one buffer, and the products then read and write slices of it (rows P + C apart): bf16 products over
   such slices ran 2-2.5x slower than over dense buffers. Here the two parts stay dense.

   Scores are fp32 or bf16 (widened exactly), the arithmetic in fp32 as aten's softmax computes a bf16 one: the row's
   max, exp(x - max) (native_lanes.h's Cephes expf, within 2 ulp; below its cut 0), their fp32 sum, each exp times
   its reciprocal, rounded to the buffer's dtype as torch's cast. */

#include "native_lanes.h"
#include <stdlib.h>

/* x rounded to bf16 as torch's cast rounds it (nearest even), kept widened; a NaN stays a NaN */
INLINE vec bf16_rounded(vec x) {
#if LANES == 16
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
                                 _mm512_set1_epi32((int)0xffff0000u));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(r), x);
#else
    vuint u = (vuint)x;
    vuint r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return lanes_where(x != x, x, (vec)r);
#endif
}

/* lanes j .. j + k - 1 of a row's scores plus its bias (NULL: none), the sum rounded to the buffer's dtype as aten's
   add_ leaves it; lanes past k `fill` */
INLINE vec biased(const void *row, const void *bias, int64_t j, int64_t k, int bf16, float fill) {
    vec x = load(row, j, k, bf16, 0, 1.0f, fill);
    if (!bias) return x;
    x = add(x, load(bias, j, k, bf16, 0, 1.0f, 0.0f));
    return bf16 ? bf16_rounded(x) : x;
}

INLINE float biased_max(const void *row, const void *bias, int64_t n, int bf16) {
    vec acc = splat(-INFINITY);
    for (int64_t j = 0; j < n; j += LANES) acc = max_lanes(acc, biased(row, bias, j, lanes_at(n, j), bf16, -INFINITY));
    return max_of(acc);
}

/* exp(x - m) of the row's biased scores x into `e` (floats); returns their sum */
INLINE float exps(const void *row, const void *bias, int64_t n, int bf16, float m, float *restrict e) {
    vec acc = splat(0.0f);
    for (int64_t j = 0; j < n; j += LANES) {
        int64_t k = lanes_at(n, j);
        vec x = exp_lanes(sub(biased(row, bias, j, k, bf16, BELOW_CUT + m), splat(m)));
        acc = add(acc, x);
        store(e, j, k, x, 0);
    }
    return sum_of(acc);
}

INLINE void scaled_store(const float *restrict e, int64_t n, float z, void *row, int bf16) {
    for (int64_t j = 0; j < n; j += LANES) {
        int64_t k = lanes_at(n, j);
        store(row, j, k, mul(load(e, j, k, 0, 0, 1.0f, 0.0f), splat(1.0f / z)), bf16);
    }
}

INLINE float dot(const void *dp, const void *p, int64_t n, int bf16) {
    vec acc = splat(0.0f);
    for (int64_t j = 0; j < n; j += LANES) {
        int64_t k = lanes_at(n, j);
        acc = add(acc, mul(load(dp, j, k, bf16, 0, 1.0f, 0.0f), load(p, j, k, bf16, 0, 1.0f, 0.0f)));
    }
    return sum_of(acc);
}

INLINE void softmax_grad(void *dp, const void *p, int64_t n, int bf16, float s) {
    for (int64_t j = 0; j < n; j += LANES) {
        int64_t k = lanes_at(n, j);
        vec g = load(dp, j, k, bf16, 0, 1.0f, 0.0f);
        store(dp, j, k, mul(load(p, j, k, bf16, 0, 1.0f, 0.0f), sub(g, splat(s))), bf16);
    }
}

/* one row. bf16 is a constant in each of row_f32 and row_bf16: the loop below runs in the function OpenMP outlines
   from rlvr_softmax_pair, for both dtypes, where bf16 would be a variable tested inside the loops over the row (fp32 on
   an AVX2 build, config F's scores: forward 0.87-0.95x, backward 0.80-0.86x the time, the same bits;
   bench/results/softmax_pair_dtype_avx2.md) */
INLINE void row_of(int64_t r, void *a, void *b, const void *pa, const void *pb, int64_t P, int64_t C, int backward,
                   const int64_t *starts, const void *bias_b, int64_t bu, int64_t bg, int64_t bc, int64_t per_u, int64_t G,
                   int64_t R, float *buffer, const int bf16) {
    size_t e = bf16 ? 2 : 4;
    char *ra = (char *)a + r * P * e, *rb = (char *)b + r * C * e;
    if (backward) {
        const char *qa = (const char *)pa + r * P * e, *qb = (const char *)pb + r * C * e;
        float s = dot(ra, qa, P, bf16) + dot(rb, qb, C, bf16);
        softmax_grad(ra, qa, P, bf16, s);
        softmax_grad(rb, qb, C, bf16, s);
    } else if (buffer) {
        int64_t u = r / per_u, start = starts ? starts[u] : 0, n = P - start;
        const char *bb = NULL;
        if (bias_b) bb = (const char *)bias_b + (u * bu + ((r / R) % G) * bg + (r % C) * bc) * e; /* g, c */
        memset(ra, 0, (size_t)start * e); /* +0.0 in both dtypes */
        ra += start * e;
        float m = biased_max(ra, NULL, n, bf16), mb = biased_max(rb, bb, C, bf16);
        m = mb > m ? mb : m;
        float z = exps(ra, NULL, n, bf16, m, buffer) + exps(rb, bb, C, bf16, m, buffer + n);
        scaled_store(buffer, n, z, ra, bf16);
        scaled_store(buffer + n, C, z, rb, bf16);
    }
}

#define ROW_ARGS                                                                                                     \
    int64_t r, void *a, void *b, const void *pa, const void *pb, int64_t P, int64_t C, int backward, const int64_t *starts, \
        const void *bias_b, int64_t bu, int64_t bg, int64_t bc, int64_t per_u, int64_t G, int64_t R, float *buffer
#define ROW_CALL r, a, b, pa, pb, P, C, backward, starts, bias_b, bu, bg, bc, per_u, G, R, buffer

static __attribute__((noinline)) void row_f32(ROW_ARGS) { row_of(ROW_CALL, 0); }

static __attribute__((noinline)) void row_bf16(ROW_ARGS) { row_of(ROW_CALL, 1); }

/* The forward (backward 0): [a | b] = softmax([a | b] + [mask_a | bias_b]) per row. The backward (1): [a | b] =
   [pa | pb] ([a | b] - sum([a | b] [pa | pb])), a and b the weights' gradient, pa and pb the forward's weights.

   a [rows, P], b [rows, C], pa, pb: bf16 or floats, contiguous. Rows in [U, Hkv, G, R] order, R rows per (u, kv head,
   g) (rep x C: a query row of group u, row g, position c = r % C). starts (or NULL) [U]: group u's first prompt key,
   the keys before it (left padding) weigh 0, as aten's softmax weighs a score plus the dtype's lowest; bias_b (or
   NULL) the own keys' [C, C] at u x bu + g x bg + c x bc, C contiguous, the scores' dtype. Returns 0, or -1 where a
   row's buffer could not be allocated. */
int rlvr_softmax_pair(void *a, void *b, const void *pa, const void *pb, int64_t rows, int64_t P, int64_t C, int bf16,
                      int backward, const int64_t *starts, const void *bias_b, int64_t bu, int64_t bg, int64_t bc,
                      int64_t U, int64_t G, int64_t R, int threads) {
    int64_t per_u = rows / U; /* Hkv x G x R */
    int use = rows * (P + C) >= (1 << 14) ? threads : 1;
    int failed = 0;
#pragma omp parallel num_threads(use) reduction(| : failed)
    {
        float *buffer = backward ? NULL : malloc((size_t)(P + C + LANES) * sizeof(float));
        if (!backward && !buffer) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) (bf16 ? row_bf16 : row_f32)(ROW_CALL);
        free(buffer);
    }
    return failed ? -1 : 0;
}

int rlvr_softmax_pair_vector_bits(void) { return lanes_vector_bits(); }
