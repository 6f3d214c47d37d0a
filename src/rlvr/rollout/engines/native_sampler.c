/* The decode's sampler for rows of logits without a filter (no top-k, top-p or min-p): one token per row by
   inverse-CDF sampling, its log-prob and the row's entropy, in two passes over each row (native_sampler.py builds and
   calls this file; the algorithm is rlvr.rollout.engines.sampling.sample_tokens's):

   x = logit / T (fp32)   m = max x   e_j = exp(x_j - m)   (native_lanes.h: flushed to 0 below e x the smallest normal)
   block sums b_k = sum of e over CDF_BLOCK entries in fp32, their running total in float64: Z = the last
   token = the first j whose running total exceeds u Z: the block by the block totals, then the block's own float64
   running total (its last nonzero weight where that total rounds below the block's fp32 sum)
   logp = (x_token - m) - log Z        H = log Z - sum(e (x - m)) / Z          (Z rounded to fp32 for both)

   torch's ops take six passes and two [n, V] temporaries (the shift, the exp, the per-block sums, the entropy's
   product and sum, the gather); here each row is read twice, from memory for its max and from the cache for the
   rest. The weights are native_lanes.h's exp, not torch's: the draws are the same distribution to fp32 rounding, a
   token differs from the torch path's only where u Z falls within a rounding of a boundary. One thread per row. */

#include "native_lanes.h"
#include <omp.h>

#define CDF_BLOCK 64 /* entries per block (sampling.CDF_BLOCK) */

/* the row's blocks' fp32 sums into sums, their float64 total into *z and the entropy's sum(e (x - m)) into *es */
INLINE void block_sums(const void *row, int64_t V, int bf16, int scaled, float T, float m, int with_entropy, float *sums,
                       double *z, double *es) {
    vec mv = splat(m);
    double total = 0.0;
    dlanes ed = dzero();
    for (int64_t b = 0; b * CDF_BLOCK < V; ++b) {
        vec acc = splat(0.0f), eacc = splat(0.0f);
        for (int64_t j = b * CDF_BLOCK; j < V && j < (b + 1) * CDF_BLOCK; j += LANES) {
            fetch_ahead(row, j, bf16);
            vec s = sub(load(row, j, lanes_at(V, j), bf16, scaled, T, BELOW_CUT + m), mv);
            vec e = exp_lanes(s);
            acc = add(acc, e);
            if (with_entropy) eacc = add(eacc, mul(e, max_lanes(s, splat(BELOW_CUT)))); /* 0 log 0 = 0 at -inf */
        }
        sums[b] = sum_of(acc);
        total += sums[b];
        if (with_entropy) ed = dadd(ed, eacc);
    }
    *z = total;
    *es = with_entropy ? dsum(ed) : 0.0;
}

/* the first entry whose running total exceeds u z (block sums as block_sums left them) */
INLINE int64_t draw(const void *row, int64_t V, int bf16, int scaled, float T, float m, const float *sums, double z, double u) {
    double target = u * z, before = 0.0;
    int64_t blocks = (V + CDF_BLOCK - 1) / CDF_BLOCK, b = 0;
    while (b < blocks - 1 && before + sums[b] <= target) before += sums[b++];
    float w[CDF_BLOCK];
    int64_t start = b * CDF_BLOCK, n = V - start < CDF_BLOCK ? V - start : CDF_BLOCK;
    vec mv = splat(m);
    for (int64_t j = 0; j < n; j += LANES) {
        int64_t k = n - j < LANES ? n - j : LANES;
        float lane[LANES];
        store(lane, 0, LANES, exp_lanes(sub(load(row, start + j, k, bf16, scaled, T, BELOW_CUT + m), mv)), 0);
        memcpy(w + j, lane, (size_t)k * sizeof(float));
    }
    double rest = target - before, running = 0.0; /* as sampling.inverse_cdf: the block's own running total */
    int64_t last = 0;
    for (int64_t j = 0; j < n; ++j) {
        if (w[j] > 0.0f) last = j;
        running += w[j];
        if (running > rest) return start + j; /* w[j] > 0: the total rose past rest here */
    }
    return start + last; /* the block's float64 total rounded below its fp32 sum: its last nonzero weight */
}

INLINE void sample_row(const void *row, int64_t V, int bf16, int scaled, float T, double u, int with_entropy, float *sums,
                       int64_t *token, float *logp, float *entropy) {
    float m = row_max(row, V, bf16, scaled, T);
    double z, es;
    block_sums(row, V, bf16, scaled, T, m, with_entropy, sums, &z, &es);
    int64_t t = draw(row, V, bf16, scaled, T, m, sums, z, u);
    float zf = (float)z, log_z = logf(zf);
    *token = t;
    *logp = (first(load(row, t, 1, bf16, scaled, T, 0.0f)) - m) - log_z;
    if (with_entropy) *entropy = log_z - (float)(es / (double)zf);
}

/* the bits of the build's vectors (native_lanes.h) */
int rlvr_sampler_vector_bits(void) { return lanes_vector_bits(); }

/* logits [n, V] (bf16 or fp32, row stride rs, V contiguous); u [n] in [0, 1); sums [threads, ceil(V / CDF_BLOCK)]
   floats of scratch; token [n], logp [n], entropy [n] (or NULL) out */
void rlvr_sample_rows(const void *logits, int bf16, int64_t rs, int64_t n, int64_t V, float T, const double *u, float *sums,
                      int64_t *token, float *logp, float *entropy, int threads) {
    int scaled = T != 1.0f, with_entropy = entropy != NULL;
    int64_t size = bf16 ? 2 : 4, blocks = (V + CDF_BLOCK - 1) / CDF_BLOCK;
    int use = n * V >= (1 << 16) ? threads : 1;
#pragma omp parallel num_threads(use)
    {
        float *mine = sums + (int64_t)omp_get_thread_num() * blocks;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; ++r) {
            const char *row = (const char *)logits + r * rs * size;
            float *e = with_entropy ? entropy + r : NULL;
            if (bf16 && !scaled) sample_row(row, V, 1, 0, 1.0f, u[r], with_entropy, mine, token + r, logp + r, e);
            else if (bf16) sample_row(row, V, 1, 1, T, u[r], with_entropy, mine, token + r, logp + r, e);
            else if (!scaled) sample_row(row, V, 0, 0, 1.0f, u[r], with_entropy, mine, token + r, logp + r, e);
            else sample_row(row, V, 0, 1, T, u[r], with_entropy, mine, token + r, logp + r, e);
        }
    }
}
