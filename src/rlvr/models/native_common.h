/* What the C kernels share (native_build compiles each with this folder on the include path and digests this file
   with it): torch's bf16 conversions and the half rotation, each value computed as torch computes it. */

#ifndef RLVR_NATIVE_COMMON_H
#define RLVR_NATIVE_COMMON_H

#include <stdint.h>
#include <string.h>

#define RLVR_MAX_D 512 /* the longest row the row helpers take (a row on the stack) */

/* a bf16 value widened to float exactly (its bits the high half of the float's) */
static inline float rlvr_widen_bf16(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* torch's float -> bf16 (its vectorised cast): rounded to nearest even, subnormals kept, a NaN to 0xffff */
static inline uint16_t rlvr_round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0xffff : rounded;
}

/* a row of D (at most RLVR_MAX_D) floats, or bf16 widened, into dst */
static inline void rlvr_widen_row(const void *src, int bf16, int64_t D, float *restrict dst) {
    if (!bf16) {
        memcpy(dst, src, (size_t)D * sizeof(float));
        return;
    }
    const uint16_t *restrict p = (const uint16_t *)src;
    uint32_t bits[RLVR_MAX_D];
    for (int64_t d = 0; d < D; ++d) bits[d] = (uint32_t)p[d] << 16;
    memcpy(dst, bits, (size_t)D * sizeof(float));
}

/* a row of D (at most RLVR_MAX_D) floats into dst as floats, or as bf16 rounded as rlvr_round_bf16 */
static inline void rlvr_store_row(const float *src, int64_t D, void *dst, int bf16) {
    if (!bf16) {
        memcpy(dst, src, (size_t)D * sizeof(float));
        return;
    }
    uint32_t bits[RLVR_MAX_D];
    memcpy(bits, src, (size_t)D * sizeof(float));
    uint16_t *restrict p = (uint16_t *)dst;
    for (int64_t d = 0; d < D; ++d) {
        uint32_t u = bits[d];
        uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        p[d] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0xffff : rounded;
    }
}

/* y = x cos + roll(x, D/2) sin~ (two products, one sum: rotate() in rlvr.models.norm_rotary; sin~ = sin with its
   first half negated) */
static inline void rlvr_rotate_row(const float *restrict x, const float *restrict cos, const float *restrict sin, int64_t D,
                                   float *restrict y) {
    int64_t half = D / 2;
    for (int64_t d = 0; d < half; ++d) {
        float a = x[d] * cos[d], b = x[d + half] * sin[d];
        y[d] = a + b;
    }
    for (int64_t d = half; d < D; ++d) {
        float a = x[d] * cos[d], b = x[d - half] * sin[d];
        y[d] = a + b;
    }
}

#endif
