/* The lean decode's attention over its KV buffers in one pass (native_attention.py builds and calls this file).

   For each (row, kv head) and its R queries (R = query heads per kv head): the scores q k_s x scale + bias_s over slots
   0..L-1 (a slot whose bias is -inf is skipped, its keys and values not read), their softmax, and sum_s p_s v_s, with
   each query's log-sum-exp. Every key and value is read once, as floats or as bf16 widened to floats; the sums run in
   float. On the CPU the decode's two batched products read the buffers at about half the memory's rate and could not
   skip the slots not yet written; this reads at about its rate (bench/results/decode_native_attention_amx.md).

   Plain C with OpenMP, no torch headers: built once per machine with -march=native and linked to the OpenMP runtime
   torch itself loaded (libgomp), so its threads are torch's. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float widen_f32(const float *p, int64_t i) { return p[i]; }

static inline float widen_bf16(const uint16_t *p, int64_t i) {
    uint32_t bits = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

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

/* q [n, H, R, D] floats, contiguous; k, v [n, H, S, D] with strides (row, head, slot) in elements and D contiguous;
   bias [n or 1, S] floats (row stride bias_stride, 0 for one row shared by all) or NULL; out [n, H, R, D] and
   lse [n, H, R] floats, contiguous; slots 0..L-1 read; threads: torch's thread count */
#define DEFINE_ATTEND(NAME, T, DOT, WIDEN)                                                                              \
    void NAME(const float *q, const T *k, const T *v, int64_t ks0, int64_t ks1, int64_t ks2, int64_t vs0, int64_t vs1,  \
              int64_t vs2, const float *bias, int64_t bias_stride, float *out, float *lse, int64_t n, int64_t H,       \
              int64_t R, int64_t D, int64_t L, float scale, int threads) {                                              \
        _Pragma("omp parallel num_threads(threads)") {                                                                  \
            float *scores = malloc(sizeof(float) * (size_t)(R * (L > 0 ? L : 1)));                                      \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < n * H; ++b) {                                   \
                int64_t row = b / H, h = b % H;                                                                         \
                const float *qb = q + b * R * D;                                                                        \
                const T *kb = k + row * ks0 + h * ks1, *vb = v + row * vs0 + h * vs1;                                   \
                const float *bb = bias ? bias + row * bias_stride : NULL;                                               \
                float *ob = out + b * R * D;                                                                            \
                for (int64_t s = 0; s < L; ++s) {                                                                       \
                    float add = bb ? bb[s] : 0.f;                                                                       \
                    for (int64_t r = 0; r < R; ++r)                                                                     \
                        scores[r * L + s] = isinf(add) && add < 0 ? add : DOT(qb + r * D, kb + s * ks2, D) * scale + add; \
                }                                                                                                       \
                for (int64_t r = 0; r < R; ++r) {                                                                       \
                    float *sr = scores + r * L, top = -INFINITY, sum = 0.f;                                             \
                    for (int64_t s = 0; s < L; ++s) top = sr[s] > top ? sr[s] : top;                                   \
                    for (int64_t s = 0; s < L; ++s) {                                                                   \
                        sr[s] = expf(sr[s] - top);                                                                      \
                        sum += sr[s];                                                                                   \
                    }                                                                                                   \
                    for (int64_t s = 0; s < L; ++s) sr[s] /= sum;                                                       \
                    lse[b * R + r] = top + logf(sum);                                                                   \
                    memset(ob + r * D, 0, sizeof(float) * (size_t)D);                                                   \
                }                                                                                                       \
                for (int64_t s = 0; s < L; ++s) {                                                                       \
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
DEFINE_ATTEND(rlvr_attend_f32, float, dot_f32, widen_f32)
DEFINE_ATTEND(rlvr_attend_bf16, uint16_t, dot_bf16, widen_bf16)
