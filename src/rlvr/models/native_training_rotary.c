/* The training forward's rotary embedding and its backward, each one pass (native_training_rotary.py builds and calls this
   file; norm_rotary._Rotary uses it where it builds).

   forward   y = x cos + roll(x, D/2) sin~        x [B, H, L, D] floats or bf16 (widened exactly), y floats
   backward  dx = g cos + roll(g sin~, D/2)       g [B, H, L, D] floats, dx floats or bf16 (rounded to nearest even)

   (sin~ = sin with its first half negated.) In torch these are four ops each way (two multiplies, a roll and an add:
   norm_rotary.rotate), each a pass over a [B, H, L, D] tensor; here every value is the same two products and one sum
   in float, built with -ffp-contract=off (rlvr.models.native_build) so that no product and sum fuse: torch's bits,
   and the bf16 rounding of torch's vectorised cast (a NaN to 0xffff). */

#include "native_common.h"

#define MAX_D RLVR_MAX_D /* the longest head the kernel takes (a row on the stack) */

/* backward: dx[d] = g[d] cos[d] + g[d +- D/2] sin~[d +- D/2] (the roll of the products, not of g) */
static inline void unrotate(const float *restrict g, const float *restrict c, const float *restrict s, int64_t D,
                            float *restrict dx) {
    int64_t half = D / 2;
    for (int64_t d = 0; d < half; ++d) {
        float a = g[d] * c[d], b = g[d + half] * s[d + half];
        dx[d] = a + b;
    }
    for (int64_t d = half; d < D; ++d) {
        float a = g[d] * c[d], b = g[d - half] * s[d - half];
        dx[d] = a + b;
    }
}

/* a row (b, h, l) of D values: in[b s0 + h s1 + l s2] (in_bf16) -> out[b o0 + h o1 + l o2] (out_bf16), cos and sin at
   b c0 + l c1; `backward` picks the transpose */
static inline __attribute__((always_inline)) void row(const void *in, int64_t s0, int64_t s1, int64_t s2, int in_bf16,
                                                      const float *cos, const float *sin, int64_t c0, int64_t c1,
                                                      void *out, int64_t o0, int64_t o1, int64_t o2, int out_bf16,
                                                      int backward, int64_t D, int64_t b, int64_t h, int64_t l) {
    float x[MAX_D], y[MAX_D];
    size_t ie = in_bf16 ? 2 : 4, oe = out_bf16 ? 2 : 4;
    rlvr_widen_row((const char *)in + (b * s0 + h * s1 + l * s2) * ie, in_bf16, D, x);
    const float *c = cos + b * c0 + l * c1, *s = sin + b * c0 + l * c1;
    if (backward)
        unrotate(x, c, s, D, y);
    else
        rlvr_rotate_row(x, c, s, D, y);
    rlvr_store_row(y, D, (char *)out + (b * o0 + h * o1 + l * o2) * oe, out_bf16);
}

/* in, out [B, H, L, D] with element strides (s0, s1, s2) and (o0, o1, o2), D contiguous; cos, sin [B, L, D] floats
   with strides (c0, c1), D contiguous. backward 0: out = rotate(in); 1: out = the rotation's transpose applied to in.
   Returns 0, or -1 for D above MAX_D or odd. */
int rlvr_rotary(const void *in, int64_t s0, int64_t s1, int64_t s2, int in_bf16, const float *cos, const float *sin,
                int64_t c0, int64_t c1, void *out, int64_t o0, int64_t o1, int64_t o2, int out_bf16, int backward,
                int64_t B, int64_t H, int64_t L, int64_t D, int threads) {
    if (D > MAX_D || D % 2) return -1;
    int64_t rows = B * L * H;
    int use = rows * D >= (1 << 14) ? threads : 1;
    /* rows in (b, l, h) order: the projections' output, [B, L, H, D] in memory, read front to back */
#pragma omp parallel for num_threads(use) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        int64_t h = r % H, l = (r / H) % L, b = r / (H * L);
        if (D == 64)
            row(in, s0, s1, s2, in_bf16, cos, sin, c0, c1, out, o0, o1, o2, out_bf16, backward, 64, b, h, l);
        else if (D == 128)
            row(in, s0, s1, s2, in_bf16, cos, sin, c0, c1, out, o0, o1, o2, out_bf16, backward, 128, b, h, l);
        else
            row(in, s0, s1, s2, in_bf16, cos, sin, c0, c1, out, o0, o1, o2, out_bf16, backward, D, b, h, l);
    }
    return 0;
}
