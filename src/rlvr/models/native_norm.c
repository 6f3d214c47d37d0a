/* The lean decode's residual add and RMSNorm in one pass, with torch's bits, and the training forward's RMSNorm
   (native_norm.py builds and calls this file).

   For each row: x + delta (the residual stream and the last block's output, floats or bf16 widened), its RMSNorm
   y = (x r) w with r = 1 / sqrt(sum(x^2) / H + eps), written as floats and, for the bf16 products that read it next,
   as bf16 rounded to nearest even. In torch that is an add, rms_norm and a cast: three passes, each with its dispatch
   and thread fan-out over a few tens of kilobytes.

   torch's bits: the sum of squares runs in the order of torch's CPU sum (aten/src/ATen/native/cpu/SumKernel.cpp:
   vectors of 8 floats, 4 of them side by side, their sums cascaded every 16 steps, then the leftover vectors, the
   4 partial vectors, the leftover floats and the 8 lanes), which aten's rms_norm uses for its mean; every other value
   is the same single float operation. Built with -ffp-contract=off (rlvr.models.native_build). native_norm.py checks
   the bits against torch's once per width before it uses the kernel, so a torch that sums otherwise is noticed. */

#include "native_common.h"
#include <stdint.h>
#include <string.h>

#define LANES 8  /* torch's Vectorized<float> in its sum kernel on x86 (AVX2 width, also where AVX-512 runs) */
#define ILP 4    /* vectors summed side by side (row_sum's ilp_factor) */
#define LEVELS 4 /* multi_row_sum's num_levels */
#define AHEAD 2  /* rows fetched ahead */

static inline int64_t ceil_log2(int64_t x) { return x <= 2 ? 1 : 64 - __builtin_clzll((uint64_t)(x - 1)); }

/* sum of x[d]^2 over d < H in torch's order (file comment); rows narrower than a vector: torch's scalar row_sum, 4
   partial sums side by side, the leftover floats into the first */
static float sum_of_squares(const float *restrict x, int64_t H) {
    if (H < LANES) {
        float p[ILP] = {0.f, 0.f, 0.f, 0.f};
        int64_t size = H / ILP; /* at most 1: no cascade */
        for (int64_t i = 0; i < size; ++i)
            for (int k = 0; k < ILP; ++k) p[k] += x[i * ILP + k] * x[i * ILP + k];
        for (int64_t d = size * ILP; d < H; ++d) p[0] += x[d] * x[d];
        for (int k = 1; k < ILP; ++k) p[0] += p[k];
        return p[0];
    }
    int64_t vecs = H / LANES, size = vecs / ILP;
    int64_t power = ceil_log2(size) / LEVELS;
    if (power < 4) power = 4;
    int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[LEVELS][ILP][LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; ++j, ++i)
            for (int k = 0; k < ILP; ++k)
                for (int l = 0; l < LANES; ++l) {
                    float v = x[(i * ILP + k) * LANES + l];
                    acc[0][k][l] += v * v;
                }
        for (int j = 1; j < LEVELS; ++j) {
            for (int k = 0; k < ILP; ++k)
                for (int l = 0; l < LANES; ++l) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.f;
                }
            if (i & (mask << (j * power))) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < ILP; ++k)
            for (int l = 0; l < LANES; ++l) {
                float v = x[(i * ILP + k) * LANES + l];
                acc[0][k][l] += v * v;
            }
    for (int j = 1; j < LEVELS; ++j)
        for (int k = 0; k < ILP; ++k)
            for (int l = 0; l < LANES; ++l) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = size * ILP; v < vecs; ++v)
        for (int l = 0; l < LANES; ++l) {
            float e = x[v * LANES + l];
            acc[0][0][l] += e * e;
        }
    for (int k = 1; k < ILP; ++k)
        for (int l = 0; l < LANES; ++l) acc[0][0][l] += acc[0][k][l];
    float total = 0.f;
    for (int64_t d = vecs * LANES; d < H; ++d) total += x[d] * x[d];
    for (int l = 0; l < LANES; ++l) total += acc[0][0][l];
    return total;
}


/* x [n, H] floats, row stride xs; delta [n, H] floats or bf16 (delta_bf16), row stride ds, or NULL; w [H] floats;
   sum_out [n, H] floats (x + delta; NULL without delta), y [n, H] floats, y16 [n, H] bf16 or NULL, rstd [n] floats
   (each row's r, which the training forward keeps for its backward) or NULL: all contiguous. */
void rlvr_add_rms_norm(const float *x, int64_t xs, const void *delta, int64_t ds, int delta_bf16, const float *w,
                       float eps, float *sum_out, float *y, uint16_t *y16, float *rstd_out, int64_t n, int64_t H,
                       int threads) {
    /* a thread fan-out costs more than a small step's whole pass */
    int use = n * H >= (1 << 14) ? threads : 1;
#pragma omp parallel for num_threads(use) schedule(static)
    for (int64_t r = 0; r < n; ++r) {
        const float *xr = x + r * xs;
        if (r + AHEAD < n) /* rows a product has just written sit in another core's cache: fetch them ahead */
            for (int64_t b = 0; b < H; b += 16) {
                __builtin_prefetch(x + (r + AHEAD) * xs + b);
                if (delta) __builtin_prefetch((const char *)delta + ((r + AHEAD) * ds + b) * (delta_bf16 ? 2 : 4));
            }
        if (delta) {
            float *sr = sum_out + r * H;
            if (delta_bf16) {
                const uint16_t *dr = (const uint16_t *)delta + r * ds;
                for (int64_t d = 0; d < H; ++d) sr[d] = xr[d] + rlvr_widen_bf16(dr[d]);
            } else {
                const float *dr = (const float *)delta + r * ds;
                for (int64_t d = 0; d < H; ++d) sr[d] = xr[d] + dr[d];
            }
            xr = sr;
        }
        float rstd = 1.f / __builtin_sqrtf(sum_of_squares(xr, H) / (float)H + eps);
        if (rstd_out) rstd_out[r] = rstd;
        float *yr = y + r * H;
        for (int64_t d = 0; d < H; ++d) {
            float normed = xr[d] * rstd;
            yr[d] = normed * w[d];
        }
        if (y16)
            for (int64_t d = 0; d < H; ++d) y16[r * H + d] = rlvr_round_bf16(yr[d]);
    }
}
