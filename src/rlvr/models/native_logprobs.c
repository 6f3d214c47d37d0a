/* The training forward's per-token log-probs and entropies over the vocabulary, and their backward, each one pass per
   token row straight from the logits (native_logprobs.py builds and calls this file; the math is
   rlvr.algo.logprobs.token_logprobs's):

   forward   x = logit / T (fp32)   m = max x   e = exp(x - m)   Z = sum e
             logp = x[index] - (log Z + m)        H = log Z - sum(e (x - m)) / Z
   backward  d_j = -p_j c_j + [j = index] g        p_j = e_j / Z,  c_j = g  (+ gh (log p_j + H) with an entropy gradient)
             with g, gh the upstream gradients over T; the gradient written as bf16 (rounded to nearest even, as
             torch's cast, a NaN as 0xffff) or fp32, over the logits themselves where the caller says they are its
             temporary.

   torch's ops make six passes over each chunk of a fp32 copy of the logits forward and three to four backward; here the
   forward reads each row twice (the max, then exp and both sums, from the cache) and the backward once, writing the
   gradient in the logits' dtype. One thread owns each token row and every lane of a row goes through the same vector
   code (the last LANES masked), so a row's values depend on nothing but the row: not the thread count, not which rows
   share a call. The no-gradient pass that gives a step's old log-probs and the training pass give the same bits, and
   the ratio starts at exactly 1.

   The lanes, the exp (flushing below e x the smallest normal float, as rlvr.algo.exp_flushed does) and the prefetch
   are native_lanes.h's. The sums run in LANES float lanes per block of BLOCK values, each block added into double
   lanes: the float error of a sum is that of BLOCK / LANES terms at any vocabulary. */

#include "native_lanes.h"

#define BLOCK 512                    /* values per block of float sums */

/* ---------------------------------------------------------------------------------------------------------------
   one row: bf16 and scaled are constants where these are inlined, each combination its own loops */

/* (Z, sum e (x - m)) of a row, the second 0 without with_entropy */
INLINE void row_sums(const void *row, int64_t V, int bf16, int scaled, float T, float m, int with_entropy, double *z,
                     double *es) {
    dlanes zd = dzero(), ed = dzero();
    vec mv = splat(m);
    for (int64_t j = 0; j < V;) {
        vec zf = splat(0.0f), ef = splat(0.0f);
        for (int64_t end = j + BLOCK < V ? j + BLOCK : V; j < end; j += LANES) {
            vec s = sub(load(row, j, lanes_at(V, j), bf16, scaled, T, BELOW_CUT + m), mv);
            vec e = exp_lanes(s);
            zf = add(zf, e);
            if (with_entropy) ef = add(ef, mul(e, max_lanes(s, splat(BELOW_CUT)))); /* e 0 at s = -inf: 0, not NaN */
        }
        zd = dadd(zd, zf);
        ed = dadd(ed, ef);
    }
    *z = dsum(zd);
    *es = dsum(ed);
}

INLINE void forward_row(const void *row, int64_t V, int bf16, int scaled, float T, int64_t index, int with_entropy,
                        float *m_out, float *log_z_out, float *logp_out, float *entropy_out) {
    float m = row_max(row, V, bf16, scaled, T);
    double z, es;
    row_sums(row, V, bf16, scaled, T, m, with_entropy, &z, &es);
    float log_z = (float)log(z);
    *m_out = m;
    *log_z_out = log_z;
    *logp_out = first(load(row, index, 1, bf16, scaled, T, 0.0f)) - (log_z + m);
    if (with_entropy) *entropy_out = (float)(log(z) - es / z);
}

/* d of LANES values s = x - m: -(e / Z) (g + gh (log p + H)) with an entropy gradient, else e (-g / Z) */
INLINE vec row_grad(vec s, int entropy_grad, vec neg_g_over_z, vec z_inv, vec g, vec gh, vec log_z, vec H) {
    vec e = exp_lanes(s);
    if (!entropy_grad) return mul(e, neg_g_over_z);
    vec coef = add(g, mul(gh, add(sub(max_lanes(s, splat(BELOW_CUT)), log_z), H))); /* finite at s = -inf, where e is 0 */
    return sub(splat(0.0f), mul(mul(e, z_inv), coef));
}

/* d_j of one row into out (bf16 or fp32; may be the row itself: each LANES are read before they are written) */
INLINE void backward_row(const void *row, void *out, int64_t V, int bf16, int scaled, float T, float m, float log_z,
                         float g, float gh, float H, int entropy_grad, int64_t index) {
    vec mv = splat(m), gv = splat(g), ghv = splat(gh), lzv = splat(log_z), Hv = splat(H);
    vec z_inv = splat((float)exp(-(double)log_z)), neg_g_over_z = splat((float)(-(double)g * exp(-(double)log_z)));
    vec picked = sub(load(row, index, 1, bf16, scaled, T, 0.0f), mv); /* read before the row is written over */
    for (int64_t j = 0; j < V; j += LANES) {
        fetch_ahead(row, j, bf16);
        int64_t n = lanes_at(V, j);
        vec s = sub(load(row, j, n, bf16, scaled, T, 0.0f), mv);
        store(out, j, n, row_grad(s, entropy_grad, neg_g_over_z, z_inv, gv, ghv, lzv, Hv), bf16);
    }
    vec d = add(row_grad(picked, entropy_grad, neg_g_over_z, z_inv, gv, ghv, lzv, Hv), gv); /* its lane 0 the index's */
    store(out, index, 1, d, bf16);
}

/* ---------------------------------------------------------------------------------------------------------------
   the calls: rows split over the threads */

/* the bits of the build's vectors (native_lanes.h) */
int rlvr_token_logprobs_vector_bits(void) { return lanes_vector_bits(); }

static int threads_for(int64_t tokens, int64_t V, int threads) { return tokens * V >= (1 << 16) ? threads : 1; }

/* logits: token (n, l) of [N, L] at logits + n s0 + l s1 (elements, bf16 or fp32), V contiguous; index [N, L]
   (each in [0, V)); m, log_z, logp, entropy (or NULL) [N, L] floats, contiguous */
void rlvr_token_logprobs(const void *logits, int bf16, int64_t s0, int64_t s1, int64_t N, int64_t L, int64_t V,
                         const int64_t *index, float T, float *m, float *log_z, float *logp, float *entropy, int threads) {
    int scaled = T != 1.0f, with_entropy = entropy != NULL;
    int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads_for(N * L, V, threads)) schedule(static)
    for (int64_t t = 0; t < N * L; ++t) {
        const char *row = (const char *)logits + ((t / L) * s0 + (t % L) * s1) * size;
        float *e = with_entropy ? entropy + t : NULL;
        if (bf16 && !scaled) forward_row(row, V, 1, 0, 1.0f, index[t], with_entropy, m + t, log_z + t, logp + t, e);
        else if (bf16) forward_row(row, V, 1, 1, T, index[t], with_entropy, m + t, log_z + t, logp + t, e);
        else if (!scaled) forward_row(row, V, 0, 0, 1.0f, index[t], with_entropy, m + t, log_z + t, logp + t, e);
        else forward_row(row, V, 0, 1, T, index[t], with_entropy, m + t, log_z + t, logp + t, e);
    }
}

/* logits as above; grad the same shape at grad + n gs0 + l gs1 in the logits' dtype (may be the logits); m, log_z,
   index [N, L] from the forward; g [N, L] the log-probs' gradient over T; gh [N, L] the entropies' over T and
   entropy [N, L] the forward's, or both NULL */
void rlvr_token_logprobs_backward(const void *logits, int bf16, int64_t s0, int64_t s1, void *grad, int64_t gs0, int64_t gs1,
                                  int64_t N, int64_t L, int64_t V, const int64_t *index, float T, const float *m,
                                  const float *log_z, const float *g, const float *gh, const float *entropy, int threads) {
    int scaled = T != 1.0f;
    int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads_for(N * L, V, threads)) schedule(static)
    for (int64_t t = 0; t < N * L; ++t) {
        int64_t n = t / L, l = t % L;
        const char *row = (const char *)logits + (n * s0 + l * s1) * size;
        char *out = (char *)grad + (n * gs0 + l * gs1) * size;
        float ght = gh ? gh[t] : 0.0f, H = gh ? entropy[t] : 0.0f;
        if (gh) backward_row(row, out, V, bf16, scaled, T, m[t], log_z[t], g[t], ght, H, 1, index[t]);
        else if (bf16 && !scaled) backward_row(row, out, V, 1, 0, 1.0f, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
        else if (bf16) backward_row(row, out, V, 1, 1, T, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
        else if (!scaled) backward_row(row, out, V, 0, 0, 1.0f, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
        else backward_row(row, out, V, 0, 1, T, m[t], log_z[t], g[t], 0.0f, 0.0f, 0, index[t]);
    }
}
