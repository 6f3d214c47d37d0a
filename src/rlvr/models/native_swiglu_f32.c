/* The Llama-family MLP's SwiGLU in fp32 for the training forward, silu(gate) x up, and its backward, one pass each
   (native_swiglu.py builds and calls this file).

   forward   out = silu(g) x up                                   silu(g) = g s,  s = sigmoid(g)
   backward  d_up = grad x silu(g)                                (the product's backward, as torch's mul)
             d_g = ((grad x up) s) (1 + g (1 - s))                (silu's backward, as torch's silu_backward)

   torch runs these as five passes over [rows, intermediate] tensors (silu, mul; mul, mul, silu_backward) and keeps
   SiLU's output for the backward besides its input; here two passes, and gate and up are what is kept. The sigmoid is
   1 / (1 + e) for g >= 0 and e / (1 + e) below, e = exp(-|g|) by native_lanes.h's exp (Cephes' expf, within 2 ulp;
   0 where -|g| is below its cut, where the sigmoid is 1 or 0 in float anyway), so no exp overflows: torch computes
   g / (1 + exp(-g)) with its own exp, so the values differ from torch's by float rounding (a few ulp), not in bits.
   Every element goes through the same vector code (a row's last elements padded to a whole vector), so a value
   depends on its inputs alone, not on the thread count or its place in the row. */

#include "native_lanes.h"

typedef int32_t lane_ints __attribute__((vector_size(4 * LANES)));

INLINE vec where(lane_ints k, vec a, vec b) { return (vec)(((lane_ints)a & k) | ((lane_ints)b & ~k)); } /* a where k */

/* n (1..LANES) floats at p, the lanes past n 0; a whole vector as one load (a memcpy of constant size), the last of a
   row through one of n */
INLINE vec loadv(const float *p, int64_t n) {
    vec v = splat(0.0f);
    if (n == LANES)
        memcpy(&v, p, sizeof v);
    else
        memcpy(&v, p, (size_t)n * sizeof(float));
    return v;
}

INLINE void storev(float *p, vec v, int64_t n) {
    if (n == LANES)
        memcpy(p, &v, sizeof v);
    else
        memcpy(p, &v, (size_t)n * sizeof(float));
}

/* sigmoid(g) for every lane */
INLINE vec sigmoid_lanes(vec g) {
    lane_ints negative = (lane_ints)(g < splat(0.0f));
    vec e = exp_lanes(where(negative, g, splat(0.0f) - g)); /* exp(-|g|) in (0, 1] */
    vec r = splat(1.0f) / (splat(1.0f) + e);
    return where(negative, e * r, r);
}

static int threads_for(int64_t rows, int64_t I, int threads) { return rows * I >= (1 << 14) ? threads : 1; }

/* g, up [rows, I] floats with row strides gs, us (I contiguous); out [rows, I] floats, contiguous */
void rlvr_swiglu_f32(const float *g, int64_t gs, const float *up, int64_t us, float *out, int64_t rows, int64_t I, int threads) {
#pragma omp parallel for num_threads(threads_for(rows, I, threads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *gr = g + r * gs, *ur = up + r * us;
        float *o = out + r * I;
        for (int64_t i = 0; i < I; i += LANES) {
            int64_t n = I - i < LANES ? I - i : LANES;
            vec x = loadv(gr + i, n);
            storev(o + i, (x * sigmoid_lanes(x)) * loadv(ur + i, n), n);
        }
    }
}

/* grad [rows, I] floats with row stride grs; g, up as above; d_g, d_up [rows, I] floats, contiguous */
void rlvr_swiglu_backward_f32(const float *grad, int64_t grs, const float *g, int64_t gs, const float *up, int64_t us, float *d_g,
                              float *d_up, int64_t rows, int64_t I, int threads) {
#pragma omp parallel for num_threads(threads_for(rows, I, threads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *dr = grad + r * grs, *gr = g + r * gs, *ur = up + r * us;
        float *dg = d_g + r * I, *du = d_up + r * I;
        for (int64_t i = 0; i < I; i += LANES) {
            int64_t n = I - i < LANES ? I - i : LANES;
            vec dy = loadv(dr + i, n), x = loadv(gr + i, n), s = sigmoid_lanes(x), one = splat(1.0f);
            storev(du + i, dy * (x * s), n);
            storev(dg + i, ((dy * loadv(ur + i, n)) * s) * (one + x * (one - s)), n);
        }
    }
}

/* the build's vector bits (native_lanes.h): 512, 256 or 0 */
int rlvr_swiglu_f32_vector_bits(void) { return lanes_vector_bits(); }
