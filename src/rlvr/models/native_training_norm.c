/* The training forward's RMSNorm backward in one pass over its rows (native_training_norm.py builds and calls this file;
   norm_rotary._RMSNorm uses it where it builds).

   y = w x r, r = (mean(x^2) + eps)^-1/2 per row (the forward's rstd, kept):
       x^ = x r
       dx = r (g w - x^ mean(g w x^))       per row, the row read once from memory (twice from cache)
       dw = sum over rows of g x^           each thread's rows summed 32 at a time, then the threads' sums in order

   In torch these are about eight ops over [rows, H] tensors (norm_rotary._RMSNorm's torch path, the same math in
   another order). The sums run in float with 16 partial sums (vectorised without reassociating a single sum), so
   each result is within float rounding of the torch path's, and as near the float64 gradient
   (tests/models/test_norm_rotary.py). */

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32 /* rows summed into dw's partial before it joins the thread's total */

/* sum over h of (g w)[h] x[h], 16 partial sums */
static inline float row_dot(const float *restrict g, const float *restrict w, const float *restrict x, int64_t H) {
    float acc[16] = {0};
    int64_t h = 0;
    for (; h + 16 <= H; h += 16)
        for (int j = 0; j < 16; ++j) acc[j] += (g[h + j] * w[h + j]) * x[h + j];
    float tail = 0.f;
    for (; h < H; ++h) tail += (g[h] * w[h]) * x[h];
    for (int j = 0; j < 8; ++j) acc[j] += acc[j + 8];
    for (int j = 0; j < 4; ++j) acc[j] += acc[j + 4];
    return tail + (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

/* x, g [n, H] floats with row strides xs, gs (H contiguous); rstd [n]; w [H]; dx [n, H] contiguous or NULL; dw [H] or
   NULL. Returns 0, or -1 where the partial sums' memory could not be had. */
int rlvr_rms_norm_backward(const float *x, int64_t xs, const float *g, int64_t gs, const float *rstd, const float *w,
                           float *dx, float *dw, int64_t n, int64_t H, int threads) {
    int use = n * H >= (1 << 14) ? threads : 1;
    float *partial = dw ? calloc((size_t)use * 2 * (size_t)H, sizeof(float)) : NULL; /* per thread: total, block */
    if (dw && !partial) return -1;
#pragma omp parallel num_threads(use)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int64_t r0 = n * t / T, r1 = n * (t + 1) / T;
        float *total = dw ? partial + (size_t)t * 2 * (size_t)H : NULL, *block = total ? total + H : NULL;
        for (int64_t r = r0; r < r1; ++r) {
            const float *xr = x + r * xs, *gr = g + r * gs;
            float rs = rstd[r];
            if (dx) {
                float mean = row_dot(gr, w, xr, H) * rs / (float)H; /* mean(g w x^), x^ = x r */
                float *o = dx + r * H;
                for (int64_t h = 0; h < H; ++h) o[h] = ((gr[h] * w[h]) - (xr[h] * rs) * mean) * rs;
            }
            if (block) {
                for (int64_t h = 0; h < H; ++h) block[h] += gr[h] * (xr[h] * rs);
                if ((r - r0) % BLOCK == BLOCK - 1 || r == r1 - 1) {
                    for (int64_t h = 0; h < H; ++h) total[h] += block[h];
                    memset(block, 0, sizeof(float) * (size_t)H);
                }
            }
        }
    }
    if (dw) {
        for (int64_t h = 0; h < H; ++h) dw[h] = 0.f;
        for (int t = 0; t < use; ++t)
            for (int64_t h = 0; h < H; ++h) dw[h] += partial[(size_t)t * 2 * (size_t)H + h];
        free(partial);
    }
    return 0;
}
