/* The sum of several gradients of one tensor in float, in one pass (native_grad_sum.py builds and calls this file;
   shared_cast's backward uses it where it builds).

   out = ((x0 + x1) + x2) + ...       each x bf16 (widened exactly) or float, each sum rounded to float

   the order given, so that the bits are those of autograd's fp32 sums of the same gradients cast to fp32. In torch this
   is a cast and n - 1 adds of a bf16 operand into the float total, each a pass over the whole tensor (and a mixed-dtype
   add_ ran at about two thirds of a plain one's rate); here each element is read once from each gradient and written
   once. Built with -ffp-contract=off (rlvr.models.native_build): nothing to fuse here, every value is a float add. */

#include "native_common.h"

#define CHUNK 2048 /* elements summed in a buffer on the stack (8 KiB: within L1) */

/* xs[k] (n of them, each numel elements, contiguous; bf16[k] whether bf16) summed in order into out (floats). */
int rlvr_grad_sum(const void *const *xs, const int *bf16, int n, int64_t numel, float *out, int threads) {
    if (n < 1) return -1;
    int64_t chunks = (numel + CHUNK - 1) / CHUNK;
    int use = numel >= (1 << 16) ? threads : 1;
#pragma omp parallel for num_threads(use) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t start = c * CHUNK, m = numel - start < CHUNK ? numel - start : CHUNK;
        float acc[CHUNK], x[CHUNK];
        for (int k = 0; k < n; ++k) {
            if (bf16[k]) {
                const uint16_t *restrict p = (const uint16_t *)xs[k] + start;
                uint32_t bits[CHUNK];
                for (int64_t i = 0; i < m; ++i) bits[i] = (uint32_t)p[i] << 16;
                memcpy(x, bits, (size_t)m * sizeof(float));
            } else {
                memcpy(x, (const float *)xs[k] + start, (size_t)m * sizeof(float));
            }
            if (k == 0)
                memcpy(acc, x, (size_t)m * sizeof(float));
            else
                for (int64_t i = 0; i < m; ++i) acc[i] = acc[i] + x[i];
        }
        memcpy(out + start, acc, (size_t)m * sizeof(float));
    }
    return 0;
}
