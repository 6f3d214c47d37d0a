/* The shared layout's prompt part of the lean decode's attention, merged with the rows' own part, as one C kernel
   (native_prefix.py builds and calls this file).

   A group's G rows share their prompt's keys and values [P, D] per kv head; each row has R queries per kv head, so a
   group's M = G x R queries attend to the same P keys: a small matrix product, then a softmax per query, then a second
   product with the values. SDPA's flash kernel ran it at about a quarter of this CPU's fp32 rate at the decode's
   shapes (head dim 40-64, M 8-64), and its inputs and outputs needed regrouping copies and a merge of five torch ops
   around it. Here, per (group, kv head) and up to QCHUNK of its queries:
     scores  QB queries x 2 vectors of slots at a time: over d, one broadcast q[j][d] times the slots' keys, from the
             keys stored transposed in blocks of KPAD slots ([Pp / KPAD, D, KPAD] per group and head, the slots padded
             with zeros to a multiple of KPAD: written once per decode, the prompt does not change), so that no product
             needs a sum across lanes and each block's keys are read as one run of memory (transposed whole, [D, Pp],
             the D rows of a block were D streams, too many for the hardware's prefetching: config C's scores took 3x
             their multiply-adds' time);
     softmax per query: x = score x scale + bias (-inf on left padding and past P), its max m, e = exp(x - m) (the
             vectorised exp of native_lanes.h: 0 for -inf), their sum; lse = m + log(sum);
     values  NQ queries x the head's vectors at a time, the value rows read once per block (a masked slot not read);
     merge   with the row's own part (its output and lse from native_attention.c): w = sigmoid(lse_prompt - lse_own),
             out = own + w (prompt - own), the exact merge of two partial softmaxes.
   Queries past the item's last are computed as copies of its last and not written (no branch in the blocks).
   Each item is computed by one thread alone, so the result does not depend on the thread count. fp32 sums throughout;
   bf16 keys and values widened exactly. */

#include "native_lanes.h"
#include <stdlib.h>

#if LANES == 16
INLINE vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__FMA__)
#include <immintrin.h>
INLINE vec fmadd(vec a, vec b, vec c) { return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
INLINE vec fmadd(vec a, vec b, vec c) { return a * b + c; }
#endif

#if LANES == 16
#define QB 8 /* queries per block of scores: 2 x QB accumulators, two key vectors and a broadcast in registers */
#define ACCUMULATORS 24 /* the values' sums held in registers (of 32), beside a value vector and the weights */
#else
#define QB 4
#define ACCUMULATORS 12 /* of 16: with NQ weights and a value vector beside them */
#endif
#define QCHUNK 32  /* queries per work item (a group's M split so that few groups still fill the threads) */
#define KPAD 32    /* the transposed keys' slots padded to a multiple of this (two vectors of 16 or four of 8) */
#define MAX_D 512  /* the longest head (the zero query row) */

typedef struct {
    const float *q;
    const void *kt; /* [B, H, Pp / KPAD, D, KPAD] */
    int64_t kts0, kts1, Pp;
    const void *v; /* [B, H, P, D] */
    int64_t vs0, vs1, vs2;
    const float *bias; /* [B, P] (row stride bias_stride): 0, or -inf on left padding */
    int64_t bias_stride;
    const float *o_own, *lse_own; /* [n, H, R, D], [n, H, R] */
    float *out;                   /* [n, H, R, D] */
    int64_t H, R, D, P;
    float scale;
} args_t;

/* whether slot s is masked (left padding): its keys and values are not read, whatever they hold */
INLINE int masked(const float *bias_row, int64_t s) { return isinf(bias_row[s]) && bias_row[s] < 0; }

/* x where bias is not -inf, else -inf (a masked slot's keys may hold NaN: its score must still be -inf) */
#if LANES == 16
INLINE vec where_unmasked(vec x, vec bias) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(bias, splat(-INFINITY), _CMP_EQ_OQ), x, bias);
}
#else
INLINE vec where_unmasked(vec x, vec bias) { return lanes_where((vint)(bias == splat(-INFINITY)), bias, x); }
#endif

/* scores of queries qi[0..QB-1] (rows of q) over every padded slot, into sc rows 0..QB-1 (row stride Pp) */
INLINE void score_block(const args_t *a, const float *const *qi, const void *ktb, float *sc, const int bf16) {
    const int64_t Pp = a->Pp, D = a->D;
    for (int64_t s0 = 0; s0 < Pp; s0 += 2 * LANES) {
        vec acc0[QB], acc1[QB];
        for (int j = 0; j < QB; ++j) acc0[j] = acc1[j] = splat(0.f);
        for (int64_t d = 0; d < D; ++d) {
            int64_t at = (s0 / KPAD * D + d) * KPAD + s0 % KPAD; /* block s0 / KPAD, row d: KPAD slots in a row */
            vec k0 = load(ktb, at, LANES, bf16, 0, 1.f, 0.f), k1 = load(ktb, at + LANES, LANES, bf16, 0, 1.f, 0.f);
            for (int j = 0; j < QB; ++j) {
                vec qd = splat(qi[j][d]);
                acc0[j] = fmadd(qd, k0, acc0[j]);
                acc1[j] = fmadd(qd, k1, acc1[j]);
            }
        }
        for (int j = 0; j < QB; ++j) {
            store(sc + j * Pp, s0, LANES, acc0[j], 0);
            store(sc + j * Pp, s0 + LANES, LANES, acc1[j], 0);
        }
    }
}

/* a score row to e = exp(x - m) in place (x = score x scale + bias, -inf past P), its lse = m + log(sum e) and sum */
INLINE void softmax_row(const args_t *a, const float *bias_row, float *sr, float *lse, float *sum) {
    const int64_t Pp = a->Pp, P = a->P;
    vec top = splat(-INFINITY);
    for (int64_t s = 0; s < Pp; s += LANES) {
        vec bias = s < P ? load(bias_row, s, lanes_at(P, s), 0, 0, 1.f, -INFINITY) : splat(-INFINITY);
        vec x = where_unmasked(add(mul(load(sr, s, LANES, 0, 0, 1.f, 0.f), splat(a->scale)), bias), bias);
        store(sr, s, LANES, x, 0);
        top = max_lanes(top, x);
    }
    float m = max_of(top);
    vec total = splat(0.f), mv = splat(m);
    for (int64_t s = 0; s < Pp; s += LANES) {
        vec e = exp_lanes(sub(load(sr, s, LANES, 0, 0, 1.f, 0.f), mv));
        store(sr, s, LANES, e, 0);
        total = add(total, e);
    }
    *sum = sum_of(total);
    *lse = m + logf(*sum);
}

/* the values' product for NQ (1, 2, 4 or 8) queries of the item at once (their weight rows e[0..NQ-1] over the slots;
   rows past the item's last are copies of it) times the value rows, each row's CC vectors loaded (and widened) once
   for the NQ queries, then each query's output normalised and merged with its own part (q[j] its place; -1: not
   written). The sums in eight arrays of CC, not one two-dimensional array: GCC kept that on the stack (each
   multiply-add a load and a store), these in registers once the loops over constant bounds unroll. */
INLINE void value_rows(const args_t *a, const void *vb, const float *const *e, const float *lse_p, const float *sum_p,
                       const int64_t *q, const float *bias_row, const int bf16, const int CC, const int NQ) {
    const int64_t D = a->D, P = a->P, vs2 = a->vs2;
    vec o0[8], o1[8], o2[8], o3[8], o4[8], o5[8], o6[8], o7[8];
    for (int c = 0; c < CC; ++c) o0[c] = o1[c] = o2[c] = o3[c] = o4[c] = o5[c] = o6[c] = o7[c] = splat(0.f);
    for (int64_t s = 0; s < P; ++s) {
        if (masked(bias_row, s)) continue; /* left padding: not read (its values may be NaN) */
        const char *vr = (const char *)vb + s * vs2 * (bf16 ? 2 : 4);
        vec w[8];
        for (int j = 0; j < NQ; ++j) w[j] = splat(e[j][s]);
#pragma GCC unroll 8
        for (int c = 0; c < CC; ++c) { /* every vector but the last whole: a constant width, the loop unrolled */
            vec v = load(vr, c * LANES, c < CC - 1 ? LANES : lanes_at(D, c * LANES), bf16, 0, 1.f, 0.f);
            o0[c] = fmadd(w[0], v, o0[c]);
#define SUM_INTO(J) \
    if (NQ > J) o##J[c] = fmadd(w[J], v, o##J[c]);
            SUM_INTO(1) SUM_INTO(2) SUM_INTO(3) SUM_INTO(4) SUM_INTO(5) SUM_INTO(6) SUM_INTO(7)
#undef SUM_INTO
        }
    }
    for (int j = 0; j < NQ; ++j) {
        if (q[j] < 0) continue;
        vec wv = splat(1.f / (1.f + expf(a->lse_own[q[j]] - lse_p[j]))), inv = splat(1.f / sum_p[j]);
        for (int c = 0; c < CC; ++c) {
            int64_t at = q[j] * D + c * LANES, nd = lanes_at(D, c * LANES);
            vec o = j == 0 ? o0[c] : j == 1 ? o1[c] : j == 2 ? o2[c] : j == 3 ? o3[c] : j == 4 ? o4[c] : j == 5 ? o5[c] : j == 6 ? o6[c] : o7[c];
            vec own = load(a->o_own, at, nd, 0, 0, 1.f, 0.f);
            store(a->out, at, nd, fmadd(wv, sub(mul(o, inv), own), own), 0);
        }
    }
}

/* the item's queries through value_rows, NQ at a time: as many as keep NQ x CC sums within ACCUMULATORS registers */
INLINE void value_blocks(const args_t *a, const void *vb, const float *sc, const float *lse_p, const float *sum_p, const int64_t *qidx,
                         int64_t count, const float *bias_row, const int bf16, const int CC) {
    const int NQ = CC * 8 <= ACCUMULATORS ? 8 : CC * 4 <= ACCUMULATORS ? 4 : CC * 2 <= ACCUMULATORS ? 2 : 1;
    for (int64_t m0 = 0; m0 < count; m0 += NQ) {
        const float *e[8];
        int64_t q[8];
        float l[8], t[8];
        for (int j = 0; j < 8; ++j) {
            int64_t m = m0 + j < count ? m0 + j : count - 1;
            e[j] = sc + m * a->Pp, l[j] = lse_p[m], t[j] = sum_p[m], q[j] = m0 + j < count ? qidx[m] : -1;
        }
        if (NQ == 8)
            value_rows(a, vb, e, l, t, q, bias_row, bf16, CC, 8);
        else if (NQ == 4)
            value_rows(a, vb, e, l, t, q, bias_row, bf16, CC, 4);
        else if (NQ == 2)
            value_rows(a, vb, e, l, t, q, bias_row, bf16, CC, 2);
        else
            value_rows(a, vb, e, l, t, q, bias_row, bf16, CC, 1);
    }
}

/* value_row's work for a head over 8 vectors (up to MAX_D floats), its sums through memory */
static void wide_value_row(const args_t *a, const void *vb, const float *sc, const float *lse_p, const float *sum_p, const int64_t *qidx,
                           int64_t m, const float *bias_row, const int bf16) {
    const int64_t D = a->D, P = a->P;
    float o[MAX_D] = {0};
    const float *e = sc + m * a->Pp;
    for (int64_t s = 0; s < P; ++s) {
        if (masked(bias_row, s)) continue; /* left padding: not read */
        float row[MAX_D];
        rlvr_widen_row(bf16 ? (const void *)((const uint16_t *)vb + s * a->vs2) : (const void *)((const float *)vb + s * a->vs2), bf16, D, row);
        for (int64_t d = 0; d < D; ++d) o[d] += e[s] * row[d];
    }
    int64_t q = qidx[m];
    float w = 1.f / (1.f + expf(a->lse_own[q] - lse_p[m])), inv = 1.f / sum_p[m];
    for (int64_t d = 0; d < D; ++d) {
        float own = a->o_own[q * D + d];
        a->out[q * D + d] = own + w * (o[d] * inv - own);
    }
}

/* the values' product of each query, with C vectors per head a constant (registers) */
INLINE void values(const args_t *a, const void *vb, const float *sc, const float *lse_p, const float *sum_p, const int64_t *qidx,
                   int64_t count, const float *bias_row, const int bf16) {
    const int64_t C = (a->D + LANES - 1) / LANES;
    switch (C) { /* CC a constant in each: the loops over it unroll */
    case 1: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 1); return;
    case 2: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 2); return;
    case 3: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 3); return;
    case 4: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 4); return;
    case 5: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 5); return;
    case 6: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 6); return;
    case 7: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 7); return;
    case 8: value_blocks(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16, 8); return;
    default: /* heads over 8 vectors: a query at a time, its output through memory */
        for (int64_t m0 = 0; m0 < count; ++m0) wide_value_row(a, vb, sc, lse_p, sum_p, qidx, m0, bias_row, bf16);
    }
}

/* one item: group b's queries [m_begin, m_end) of kv head h (query m: row start + m / R, query m % R) */
INLINE void item(const args_t *a, int64_t b, int64_t h, int64_t start, int64_t m_begin, int64_t m_end, float *sc, const int bf16) {
    const int64_t H = a->H, R = a->R, D = a->D, count = m_end - m_begin;
    const size_t esize = bf16 ? 2 : 4;
    const char *ktb = (const char *)a->kt + (b * a->kts0 + h * a->kts1) * esize;
    const char *vb = (const char *)a->v + (b * a->vs0 + h * a->vs1) * esize;
    const float *bias_row = a->bias + b * a->bias_stride;
    int64_t qidx[QCHUNK];
    float lse_p[QCHUNK], sum_p[QCHUNK];
    for (int64_t m = 0; m < count; ++m) {
        int64_t i = start + (m_begin + m) / R, r = (m_begin + m) % R;
        qidx[m] = (i * H + h) * R + r;
    }
    for (int64_t m0 = 0; m0 < count; m0 += QB) {
        const float *qi[QB];
        for (int j = 0; j < QB; ++j) qi[j] = a->q + qidx[m0 + j < count ? m0 + j : count - 1] * D;
        score_block(a, qi, ktb, sc + m0 * a->Pp, bf16);
    }
    for (int64_t m = 0; m < count; ++m) softmax_row(a, bias_row, sc + m * a->Pp, lse_p + m, sum_p + m);
    values(a, vb, sc, lse_p, sum_p, qidx, count, bias_row, bf16);
}

/* item for each dtype, bf16 a constant in each: the loop below runs in the function OpenMP outlines from prefix, once
   for both dtypes, where bf16 would be a variable (its tests inside the innermost loops, the values' sums kept in memory:
   6x slower at head dim 40 on an AVX2 build) */
static __attribute__((noinline)) void item_f32(const args_t *a, int64_t b, int64_t h, int64_t start, int64_t m_begin, int64_t m_end, float *sc) {
    item(a, b, h, start, m_begin, m_end, sc, 0);
}

static __attribute__((noinline)) void item_bf16(const args_t *a, int64_t b, int64_t h, int64_t start, int64_t m_begin, int64_t m_end, float *sc) {
    item(a, b, h, start, m_begin, m_end, sc, 1);
}

INLINE int prefix(const args_t *a, const int64_t *rows, int64_t n, int64_t B, int64_t G, int threads, const int bf16) {
    const int64_t H = a->H, R = a->R;
    if (a->D > MAX_D || a->Pp % KPAD || a->P > a->Pp) return 1;
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(B + 1)); /* group b's rows: start[b] .. start[b + 1] - 1 (rows ascending) */
    for (int64_t b = 0, i = 0; b <= B; ++b) {
        while (i < n && rows[i] < b * G) ++i;
        start[b] = i;
    }
    const int64_t chunks = (G * R + QCHUNK - 1) / QCHUNK, items = B * H * chunks;
    _Pragma("omp parallel num_threads(threads)") {
        float *sc = aligned_alloc(64, sizeof(float) * (size_t)((QCHUNK + QB) * a->Pp));
        _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < items; ++it) {
            int64_t b = it / (H * chunks), h = it / chunks % H, c = it % chunks;
            int64_t M = (start[b + 1] - start[b]) * R, m_begin = c * QCHUNK, m_end = M < m_begin + QCHUNK ? M : m_begin + QCHUNK;
            if (m_begin < m_end) (bf16 ? item_bf16 : item_f32)(a, b, h, start[b], m_begin, m_end, sc);
        }
        free(sc);
    }
    free(start);
    return 0;
}

/* q [n, H, R, D] fp32 contiguous (rows' queries); kt [B, H, Pp / KPAD, D, KPAD] keys transposed in blocks (strides
   of b and h in elements, the rest contiguous), Pp a multiple of KPAD, slots P.. zero; v [B, H, P, D] (strides of b, h, slot; d 1); bias [B, P]
   fp32 (row stride), 0 or -inf; rows [n] int64 ascending, each row's place b x G + g among the B x G; o_own [n, H, R, D]
   and lse_own [n, H, R] the own part's; out [n, H, R, D]. Returns 0, or 1 for a head over MAX_D or a bad padding. */
#define DEFINE_PREFIX(NAME, BF16)                                                                                             \
    int NAME(const float *q, const void *kt, int64_t kts0, int64_t kts1, int64_t Pp, const void *v, int64_t vs0, int64_t vs1, \
             int64_t vs2, const float *bias, int64_t bias_stride, const int64_t *rows, int64_t G, const float *o_own,         \
             const float *lse_own, float *out, int64_t n, int64_t B, int64_t H, int64_t R, int64_t D, int64_t P, float scale, \
             int threads) {                                                                                                   \
        args_t a = {q, kt, kts0, kts1, Pp, v, vs0, vs1, vs2, bias, bias_stride, o_own, lse_own, out, H, R, D, P, scale};      \
        return prefix(&a, rows, n, B, G, threads, BF16);                                                                      \
    }

DEFINE_PREFIX(rlvr_prefix_f32, 0)
DEFINE_PREFIX(rlvr_prefix_bf16, 1)

/* the build's vector bits (native_lanes.h): 512, 256 or 0 */
int rlvr_prefix_vector_bits(void) { return lanes_vector_bits(); }
