/* The Llama-family MLP's SwiGLU in bf16, silu(gate) x up, and its backward, one pass each (native_swiglu.py builds
   and calls this file; the training forward and the decode step use it under bf16 autocast).

   forward   out = bf16(silu(g) x up)                              silu(g) = bf16(g / (1 + exp(-g)))
   backward  d_up = bf16(grad x silu(g))                           (the product's backward, as torch's mul)
             t = bf16(grad x up),  s = sigmoid(g)                  (silu's backward, as torch's silu_backward:
             d_g = bf16((t s) (1 + g (1 - s)))                      the products and sums in this order)

   A bf16 input has 65536 values, so silu(g) and sigmoid(g) come from tables torch itself computed for every one of
   them (native_swiglu.py): the exp is torch's own, and every product and sum here is float arithmetic in torch's
   order, built with -ffp-contract=off (rlvr.models.native_build) so that none fuses. Each result is rounded to bf16
   to nearest even as torch's vectorised cast rounds it (a NaN to 0xffff): torch's bits. */

#include "native_common.h"
#include <stdint.h>
#include <string.h>

static int threads_for(int64_t rows, int64_t I, int threads) { return rows * I >= (1 << 14) ? threads : 1; }

#ifdef __AVX2__
#include <immintrin.h>
/* eight bf16 at p widened to floats, and their bits as table indices */
static inline __m256i indices8(const uint16_t *p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 widen8(const uint16_t *p) { return _mm256_castsi256_ps(_mm256_slli_epi32(indices8(p), 16)); }

/* eight floats rounded to bf16 as rlvr_round_bf16, into the low 16 bits of each lane */
static inline __m256i round8(__m256 f) {
    __m256i u = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0xffff), nan);
}

/* sixteen rounded lanes (two vectors) stored as bf16 at p, in order */
static inline void store16(uint16_t *p, __m256i lo, __m256i hi) {
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256((__m256i *)p, packed);
}
#endif

/* g, up [rows, I] bf16 with row strides gs, us (I contiguous); silu [65536] floats (bf16 values) indexed by g's bits;
   out [rows, I] bf16, contiguous */
void rlvr_swiglu(const uint16_t *g, int64_t gs, const uint16_t *up, int64_t us, const float *silu, uint16_t *out,
                 int64_t rows, int64_t I, int threads) {
#pragma omp parallel for num_threads(threads_for(rows, I, threads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *gr = g + r * gs, *ur = up + r * us;
        uint16_t *o = out + r * I;
        int64_t i = 0;
#ifdef __AVX2__
        for (; i + 16 <= I; i += 16) {
            __m256 a = _mm256_mul_ps(_mm256_i32gather_ps(silu, indices8(gr + i), 4), widen8(ur + i));
            __m256 b = _mm256_mul_ps(_mm256_i32gather_ps(silu, indices8(gr + i + 8), 4), widen8(ur + i + 8));
            store16(o + i, round8(a), round8(b));
        }
#endif
        for (; i < I; ++i) o[i] = rlvr_round_bf16(silu[gr[i]] * rlvr_widen_bf16(ur[i]));
    }
}

#ifdef __AVX2__
/* eight lanes of the backward: d_up and d_g rounded, as the scalar loop below */
static inline void backward8(const uint16_t *dr, const uint16_t *gr, const uint16_t *ur, const float *silu,
                             const float *sigmoid, __m256i *du, __m256i *dg) {
    __m256i idx = indices8(gr);
    __m256 dy = widen8(dr), x = widen8(gr), s = _mm256_i32gather_ps(sigmoid, idx, 4), one = _mm256_set1_ps(1.0f);
    *du = round8(_mm256_mul_ps(dy, _mm256_i32gather_ps(silu, idx, 4)));
    __m256 t = _mm256_castsi256_ps(_mm256_slli_epi32(round8(_mm256_mul_ps(dy, widen8(ur))), 16));
    __m256 right = _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, s)));
    *dg = round8(_mm256_mul_ps(_mm256_mul_ps(t, s), right));
}
#endif

/* grad [rows, I] bf16, row stride grs; g, up as above; silu and sigmoid [65536] floats indexed by g's bits; d_g, d_up
   [rows, I] bf16, contiguous */
void rlvr_swiglu_backward(const uint16_t *grad, int64_t grs, const uint16_t *g, int64_t gs, const uint16_t *up,
                          int64_t us, const float *silu, const float *sigmoid, uint16_t *d_g, uint16_t *d_up,
                          int64_t rows, int64_t I, int threads) {
#pragma omp parallel for num_threads(threads_for(rows, I, threads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t *dr = grad + r * grs, *gr = g + r * gs, *ur = up + r * us;
        uint16_t *dg = d_g + r * I, *du = d_up + r * I;
        int64_t i = 0;
#ifdef __AVX2__
        for (; i + 16 <= I; i += 16) {
            __m256i du0, dg0, du1, dg1;
            backward8(dr + i, gr + i, ur + i, silu, sigmoid, &du0, &dg0);
            backward8(dr + i + 8, gr + i + 8, ur + i + 8, silu, sigmoid, &du1, &dg1);
            store16(du + i, du0, du1);
            store16(dg + i, dg0, dg1);
        }
#endif
        for (; i < I; ++i) {
            float dy = rlvr_widen_bf16(dr[i]), x = rlvr_widen_bf16(gr[i]), s = sigmoid[gr[i]];
            du[i] = rlvr_round_bf16(dy * silu[gr[i]]);
            float t = rlvr_widen_bf16(rlvr_round_bf16(dy * rlvr_widen_bf16(ur[i])));
            float left = t * s, right = 1.0f + x * (1.0f - s);
            dg[i] = rlvr_round_bf16(left * right);
        }
    }
}
