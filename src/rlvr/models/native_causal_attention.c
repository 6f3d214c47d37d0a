/* The training forward's causal attention in fp32 and its backward, each one pass per (row, kv head) (native_causal_attention.py
   builds and calls this file; rlvr.models.attention takes it for the plain causal call).

   Query i of a row sees keys j with start <= j < stop and j <= i + Lk - Lq (causal, aligned to the last key; start and
   stop the row's keys that are not padding). A row's Lk keys are its own C, or P of a prompt its group of G rows
   shares and then its own (rlvr.models.prefix_attention: the prompt's keys read in place, its gradients per row). For the R query heads that read one kv head the queries are rows (i, r),
   i-major, so every 6 consecutive rows see nearly the same keys and each block of keys is seen by a tail of the rows:

       forward   S = q k^T x scale (masked: -inf)   m = max_j S   p = exp(S - m)   out = (p v) / sum p   lse = m + log sum p
       backward  p = exp(S - lse)   dp = dout v^T   ds = p (dp - sum_d dout out) x scale
                 dq = ds k          dk = ds^T q     dv = p^T dout

   Every product is one register-blocked kernel (6 rows x 2 vectors, the B operand packed in panels, the A operand rows
   read in place) over the keys a block sees only: the causal half and the left padding are skipped, where torch's flash
   kernel computes every key block of 512. A row with no key (all padding) gets 0 out, 0 gradients. The exp is
   native_lanes.h's (Cephes' expf, within 2 ulp). Sums run in an order fixed by the shapes alone (the items, (row, kv
   head), one thread each): the same bits whatever the thread count.

   Plain C with OpenMP, no torch headers: built once per machine with -march=native (native_build). */

#include "native_lanes.h"
#include <stdlib.h>

/* a * b + c fused, and *p in every lane in one load (native_lanes.h's splat adds 0 to its float first: -0 + 0 is +0) */
#if LANES == 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define BROADCAST(p) _mm512_set1_ps(*(p))
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FMA(a, b, c) ((vec)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define BROADCAST(p) ((vec)_mm256_broadcast_ss(p))
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#define BROADCAST(p) splat(*(p))
#endif

/* the panel's two vectors held in registers (native_linear.c: GCC's znver tuning loads each again per use, 0.7x); SSE
   holds a vector in two registers, which the constraint cannot name */
#if LANES == 16 || defined(__AVX2__)
#define IN_REGISTERS(a, b) __asm__("" : "+v"(a), "+v"(b))
#else
#define IN_REGISTERS(a, b) ((void)0)
#endif

#define MR 6           /* rows per register block */
#define NR (2 * LANES) /* columns per panel */

INLINE vec vload(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}
INLINE void vstore(float *p, vec v) { memcpy(p, &v, sizeof v); }
INLINE int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
INLINE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---------------------------------------------------------------------------------------------------------------
   packing and the product */

/* rows x[0 .. n) of D as the B operand of a product over D: panels over the rows, [ceil(n / NR)][D][NR], zeros past n */
static void pack_over_rows(const float *const *x, int64_t n, int64_t D, float *panels) {
    /* row by row, each read once in order and written NR apart (the lines of one panel stay in L1): read column by
       column the compiler gathered from NR rows at a time, 7 % of the forward of H's shapes on an AMD EPYC */
    for (int64_t p = 0; p * NR < n; ++p) {
        float *panel = panels + p * D * NR;
        for (int64_t j = 0; j < NR; ++j) {
            if (p * NR + j < n) {
                const float *row = x[p * NR + j];
                for (int64_t d = 0; d < D; ++d) panel[d * NR + j] = row[d];
            } else
                for (int64_t d = 0; d < D; ++d) panel[d * NR + j] = 0.0f;
        }
    }
}

/* rows x[0 .. n) of D as the B operand of a product over the rows: panels over D, [ceil(D / NR)][n][NR], zeros past D */
static void pack_over_cols(const float *const *x, int64_t n, int64_t D, float *panels) {
    /* each row's run of NR columns copied as two vectors (elementwise the compiler gathered across rows; a memcpy of a
       variable length became rep movs, slower still) */
    for (int64_t p = 0; p * NR < D; ++p) {
        int64_t w = min64(NR, D - p * NR);
        for (int64_t k = 0; k < n; ++k) {
            float *to = panels + (p * n + k) * NR;
            const float *from = x[k] + p * NR;
            if (w == NR) {
                vstore(to, vload(from));
                vstore(to + LANES, vload(from + LANES));
            } else
                for (int64_t j = 0; j < NR; ++j) to[j] = j < w ? from[j] : 0.0f;
        }
    }
}

/* c[i][0 .. vecs x LANES) (+)= sum_{k0 <= k < k1} a[i][k x ka] panel[k][.], i < rows (at most MR): a[i] the A rows
   (their elements ka apart), c rows ldc apart; vecs 2 (a whole panel) or 1 (its first half: D's last columns) */
INLINE void block(const float *const *a, int64_t ka, int rows, const float *panel, int64_t k0, int64_t k1, float *c, int64_t ldc,
                  int add, int vecs) {
    vec acc[MR][2]; /* indexed by constants only (the loops unrolled), or GCC keeps it in memory */
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
        acc[i][0] = add && i < rows ? vload(c + i * ldc) : splat(0.0f);
        acc[i][1] = add && i < rows && vecs == 2 ? vload(c + i * ldc + LANES) : splat(0.0f);
    }
    const float *a0 = a[0], *a1 = a[rows > 1], *a2 = a[rows > 2 ? 2 : 0], *a3 = a[rows > 3 ? 3 : 0], *a4 = a[rows > 4 ? 4 : 0],
                *a5 = a[rows > 5 ? 5 : 0];
    const float *b = panel + k0 * NR;
    if (vecs == 2)
        for (int64_t k = k0; k < k1; ++k, b += NR) {
            vec b0 = vload(b), b1 = vload(b + LANES), s;
            IN_REGISTERS(b0, b1);
            int64_t x = k * ka;
            s = BROADCAST(a0 + x), acc[0][0] = FMA(s, b0, acc[0][0]), acc[0][1] = FMA(s, b1, acc[0][1]);
            s = BROADCAST(a1 + x), acc[1][0] = FMA(s, b0, acc[1][0]), acc[1][1] = FMA(s, b1, acc[1][1]);
            s = BROADCAST(a2 + x), acc[2][0] = FMA(s, b0, acc[2][0]), acc[2][1] = FMA(s, b1, acc[2][1]);
            s = BROADCAST(a3 + x), acc[3][0] = FMA(s, b0, acc[3][0]), acc[3][1] = FMA(s, b1, acc[3][1]);
            s = BROADCAST(a4 + x), acc[4][0] = FMA(s, b0, acc[4][0]), acc[4][1] = FMA(s, b1, acc[4][1]);
            s = BROADCAST(a5 + x), acc[5][0] = FMA(s, b0, acc[5][0]), acc[5][1] = FMA(s, b1, acc[5][1]);
        }
    else
        for (int64_t k = k0; k < k1; ++k, b += NR) {
            vec b0 = vload(b), s;
            int64_t x = k * ka;
            s = BROADCAST(a0 + x), acc[0][0] = FMA(s, b0, acc[0][0]);
            s = BROADCAST(a1 + x), acc[1][0] = FMA(s, b0, acc[1][0]);
            s = BROADCAST(a2 + x), acc[2][0] = FMA(s, b0, acc[2][0]);
            s = BROADCAST(a3 + x), acc[3][0] = FMA(s, b0, acc[3][0]);
            s = BROADCAST(a4 + x), acc[4][0] = FMA(s, b0, acc[4][0]);
            s = BROADCAST(a5 + x), acc[5][0] = FMA(s, b0, acc[5][0]);
        }
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i)
        if (i < rows) {
            vstore(c + i * ldc, acc[i][0]);
            if (vecs == 2) vstore(c + i * ldc + LANES, acc[i][1]);
        }
}

/* c [rows, panels x NR] (+)= a x panels p0 <= p < p1 of B (each [K][NR]), over k0 <= k < k1; cols: the columns that
   count (the last panel's past cols not written where they fit half a panel) */
static void product(const float *const *a, int64_t ka, int rows, const float *panels, int64_t K, int64_t p0, int64_t p1, int64_t k0,
                    int64_t k1, float *c, int64_t ldc, int add, int64_t cols) {
    for (int64_t p = p0; p < p1; ++p)
        if (cols - p * NR > LANES)
            block(a, ka, rows, panels + p * K * NR, k0, k1, c + p * NR, ldc, add, 2);
        else
            block(a, ka, rows, panels + p * K * NR, k0, k1, c + p * NR, ldc, add, 1);
}

/* ---------------------------------------------------------------------------------------------------------------
   one item: a (row, kv head) */

typedef struct {
    const float *q, *k, *v, *pk, *pv, *out, *dout; /* the tensors' first element (out, dout: [B, Lq, H, D] contiguous) */
    int64_t qs[3], ks[3], vs[3], pks[3], pvs[3];   /* strides (row, head, position) of q [B, H, Lq, D], the rows' own
                                                      keys and values [B, Hkv, C, D] and the prompts' [B / G, Hkv, P, D] */
    const int64_t *start, *stop;                   /* [B] each row's keys that are not padding, of its P + C */
    int64_t B, H, Hkv, Lq, C, P, G, D, Lk;         /* Lk = P + C: a row's keys, its group's prompt's first */
    float scale;
} Shapes;


/* the keys [*j0, *j1) query i of row b sees */
INLINE void seen(const Shapes *s, int64_t b, int64_t i, int64_t *j0, int64_t *j1) {
    *j0 = s->start[b];
    *j1 = min64(s->stop[b], i + s->Lk - s->Lq + 1);
}

/* rows r0 .. r0 + n (i-major: row i x R + r is query i of head g x R + r) of q (strides qs) or, qs NULL, of a contiguous
   [B, Lq, H, D] tensor x, for item (b, g) */
INLINE void rows_of(const Shapes *s, const float *x, const int64_t *xs, int64_t b, int64_t g, int64_t r0, int64_t n, const float **rows) {
    int64_t R = s->H / s->Hkv;
    for (int64_t t = 0; t < n; ++t) {
        int64_t i = (r0 + t) / R, h = g * R + (r0 + t) % R;
        rows[t] = xs ? x + b * xs[0] + h * xs[1] + i * xs[2] : x + ((b * s->Lq + i) * s->H + h) * s->D;
    }
}

/* the keys (values: 1) 0 .. Lk of item (b, g) as row pointers: its group's prompt's, then its own */
INLINE void keys_of(const Shapes *s, int values, int64_t b, int64_t g, const float **rows) {
    const float *x = values ? s->v : s->k, *px = values ? s->pv : s->pk;
    const int64_t *xs = values ? s->vs : s->ks, *pxs = values ? s->pvs : s->pks;
    for (int64_t j = 0; j < s->P; ++j) rows[j] = px + b / s->G * pxs[0] + g * pxs[1] + j * pxs[2];
    for (int64_t j = 0; j < s->C; ++j) rows[s->P + j] = x + b * xs[0] + g * xs[1] + j * xs[2];
}

/* a row of scores S[0 .. width) into exp(S x scale - shift) on the keys [j0, j1) it sees, 0 elsewhere, their sum into
   *sum; shift NAN: by the max of S x scale over those keys (max S x scale: the rounding keeps the order), returned */
INLINE float exp_row(float *S, int64_t width, int64_t j0, int64_t j1, float scale, float shift, float *sum) {
    if (shift != shift) {
        vec m = splat(-INFINITY);
        for (int64_t j = j0 / LANES * LANES; j < j1; j += LANES) {
            vec x = vload(S + j);
            if (j < j0 || j + LANES > j1)
                for (int64_t t = 0; t < LANES; ++t)
                    if (j + t < j0 || j + t >= j1) x[t] = -INFINITY;
            m = max_lanes(m, x);
        }
        shift = max_of(m) * scale;
    }
    vec acc = splat(0.0f);
    for (int64_t j = 0; j < width; j += LANES) {
        vec e = exp_lanes(sub(mul(vload(S + j), splat(scale)), splat(shift)));
        if (j < j0 || j + LANES > j1)
            for (int64_t t = 0; t < LANES; ++t)
                if (j + t < j0 || j + t >= j1) e[t] = 0.0f;
        vstore(S + j, e);
        acc = add(acc, e);
    }
    *sum = sum_of(acc);
    return shift;
}

/* the panels [*p0, *p1) of keys that rows r0 .. r0 + n see */
INLINE void panels_seen(const Shapes *s, int64_t b, int64_t r0, int64_t n, int64_t *p0, int64_t *p1) {
    int64_t R = s->H / s->Hkv, j0, j1;
    seen(s, b, (r0 + n - 1) / R, &j0, &j1);
    *p0 = j0 / NR;
    *p1 = j1 > j0 ? (j1 + NR - 1) / NR : *p0;
}

/* ---------------------------------------------------------------------------------------------------------------
   forward */

typedef struct {
    float *kp, *vp, *S, *O;
    const float **keys;
} ForwardScratch;

static void forward_item(const Shapes *s, int64_t b, int64_t g, float *out, float *lse, ForwardScratch w) {
    int64_t R = s->H / s->Hkv, Lk = s->Lk, D = s->D, rows = R * s->Lq, DP = round_up(D, NR), width = round_up(Lk, NR);
    keys_of(s, 0, b, g, w.keys);
    pack_over_rows(w.keys, Lk, D, w.kp);
    keys_of(s, 1, b, g, w.keys);
    pack_over_cols(w.keys, Lk, D, w.vp);
    for (int64_t r0 = 0; r0 < rows; r0 += MR) {
        int n = (int)min64(MR, rows - r0);
        const float *a[MR];
        float sums[MR];
        int64_t p0, p1;
        panels_seen(s, b, r0, n, &p0, &p1);
        rows_of(s, s->q, s->qs, b, g, r0, n, a);
        product(a, 1, n, w.kp, D, p0, p1, 0, D, w.S, width, 0, width); /* S = q k^T */
        for (int t = 0; t < n; ++t) {
            int64_t i = (r0 + t) / R, h = g * R + (r0 + t) % R, j0, j1;
            seen(s, b, i, &j0, &j1);
            float *row = w.S + t * width + p0 * NR, *l = lse + (b * s->H + h) * s->Lq + i;
            if (j0 >= j1) { /* no key: 0 out, and an lse that turns every weight of the backward into 0 */
                memset(row, 0, (size_t)(p1 - p0) * NR * sizeof(float));
                sums[t] = 0.0f, *l = INFINITY;
                continue;
            }
            float m = exp_row(row, (p1 - p0) * NR, j0 - p0 * NR, j1 - p0 * NR, s->scale, NAN, &sums[t]);
            *l = m + logf(sums[t]);
        }
        for (int t = 0; t < n; ++t) a[t] = w.S + t * width;
        product(a, 1, n, w.vp, Lk, 0, DP / NR, p0 * NR, min64(p1 * NR, Lk), w.O, DP, 0, D); /* O = p v */
        for (int t = 0; t < n; ++t) {
            int64_t i = (r0 + t) / R, h = g * R + (r0 + t) % R;
            float *o = out + ((b * s->Lq + i) * s->H + h) * D;
            for (int64_t d = 0; d < D; ++d) o[d] = sums[t] > 0.0f ? w.O[t * DP + d] / sums[t] : 0.0f;
        }
    }
}

/* *s from the entry points' arguments (shape: B, H, Hkv, Lq, C, P, G, D, then the strides of q, k, v, pk and pv, three
   each); 0 where they do not describe a call the kernel can run */
static int shapes_of(Shapes *s, const float *q, const float *k, const float *v, const float *pk, const float *pv, const float *out,
                     const float *dout, const int64_t *shape, const int64_t *start, const int64_t *stop, float scale) {
    const int64_t *st = shape + 8;
    *s = (Shapes){.q = q, .k = k, .v = v, .pk = pk, .pv = pv, .out = out, .dout = dout, .start = start, .stop = stop, .scale = scale};
    for (int t = 0; t < 3; ++t)
        s->qs[t] = st[t], s->ks[t] = st[3 + t], s->vs[t] = st[6 + t], s->pks[t] = st[9 + t], s->pvs[t] = st[12 + t];
    s->B = shape[0], s->H = shape[1], s->Hkv = shape[2], s->Lq = shape[3], s->C = shape[4], s->P = shape[5], s->G = shape[6];
    s->D = shape[7], s->Lk = s->P + s->C;
    return s->B >= 1 && s->Lq >= 1 && s->Hkv >= 1 && s->H % s->Hkv == 0 && s->D >= 1 && s->C >= s->Lq && s->P >= 0 && s->G >= 1 &&
           (s->P == 0 || s->B % s->G == 0);
}

#define ALLOC(n) malloc(sizeof(float) * (size_t)(n))

/* q [B, H, Lq, D]; k and v [B, Hkv, C, D], each row's own keys; pk and pv [B / G, Hkv, P, D], each group's prompt's
   (P 0: none); strides in elements, D contiguous; start/stop [B] int64 over each row's P + C keys: out [B, Lq, H, D] and
   lse [B, H, Lq] contiguous; 0, else 1 (shapes) or 2 (memory) */
int rlvr_causal_attention_forward(const float *q, const float *k, const float *v, const float *pk, const float *pv, const int64_t *shape,
                                  const int64_t *start, const int64_t *stop, float scale, float *out, float *lse, int threads) {
    Shapes s;
    if (!shapes_of(&s, q, k, v, pk, pv, NULL, NULL, shape, start, stop, scale)) return 1;
    int64_t B = s.B, Hkv = s.Hkv, Lk = s.Lk, D = s.D, width = round_up(Lk, NR), DP = round_up(D, NR);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        ForwardScratch w = {ALLOC(width * D), ALLOC(DP * Lk), ALLOC(MR * width), ALLOC(MR * DP), malloc(sizeof(float *) * (size_t)Lk)};
        int ok = w.kp && w.vp && w.S && w.O && w.keys;
        failed |= !ok;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < B * Hkv; ++item)
            if (ok) forward_item(&s, item / Hkv, item % Hkv, out, lse, w);
        free(w.kp), free(w.vp), free(w.S), free(w.O), free(w.keys);
    }
    return failed ? 2 : 0;
}

/* ---------------------------------------------------------------------------------------------------------------
   backward */

#define BLOCK_ROWS 64 /* query rows (i, r) per block: the length of the products into the key and value gradients */

typedef struct {
    float *kp, *vtp, *kd;  /* k and v packed over the keys ([width / NR][D][NR]), k packed over D ([DP / NR][Lk][NR]) */
    float *qpan, *dopan;   /* the block's q and dout packed over D ([DP / NR][BLOCK_ROWS][NR]) */
    float *P, *dS;         /* the block's weights, and dp then ds, [BLOCK_ROWS][width] */
    float *dq;             /* a register block's dq [MR][DP] */
    float *dk, *dv;        /* the item's key and value gradients [Lk][DP] */
    float *delta;          /* the block's sum_d dout out per row */
    const float **keys, **qrows, **drows, **orows;
} BackwardScratch;

static void backward_item(const Shapes *s, int64_t b, int64_t g, const float *lse, float *dq, float *dk, float *dv, float *dpk, float *dpv,
                          BackwardScratch w) {
    int64_t R = s->H / s->Hkv, Lk = s->Lk, D = s->D, rows = R * s->Lq, DP = round_up(D, NR), width = round_up(Lk, NR);
    int64_t off = Lk - s->Lq, NB = BLOCK_ROWS / R > 0 ? BLOCK_ROWS / R * R : R;
    keys_of(s, 0, b, g, w.keys);
    pack_over_rows(w.keys, Lk, D, w.kp);
    pack_over_cols(w.keys, Lk, D, w.kd);
    keys_of(s, 1, b, g, w.keys);
    pack_over_rows(w.keys, Lk, D, w.vtp);
    memset(w.dk, 0, sizeof(float) * (size_t)(Lk * DP));
    memset(w.dv, 0, sizeof(float) * (size_t)(Lk * DP));
    for (int64_t b0 = 0; b0 < rows; b0 += NB) { /* a block of query rows b0 .. b0 + nb */
        int64_t nb = min64(NB, rows - b0), q0, q1;
        panels_seen(s, b, b0, nb, &q0, &q1); /* the keys the block sees */
        if (q1 == q0) { /* none (left padding): no gradient */
            for (int64_t c = 0; c < nb; ++c) {
                int64_t i = (b0 + c) / R, h = g * R + (b0 + c) % R;
                memset(dq + ((b * s->Lq + i) * s->H + h) * D, 0, sizeof(float) * (size_t)D);
            }
            continue;
        }
        rows_of(s, s->q, s->qs, b, g, b0, nb, w.qrows);
        rows_of(s, s->dout, NULL, b, g, b0, nb, w.drows);
        rows_of(s, s->out, NULL, b, g, b0, nb, w.orows);
        pack_over_cols(w.qrows, nb, D, w.qpan);
        pack_over_cols(w.drows, nb, D, w.dopan);
        for (int64_t c = 0; c < nb; ++c) {
            float acc = 0.0f;
            for (int64_t d = 0; d < D; ++d) acc += w.drows[c][d] * w.orows[c][d];
            w.delta[c] = acc;
        }
        for (int64_t c0 = 0; c0 < nb; c0 += MR) { /* a register block of rows c0 .. c0 + n of the block */
            int n = (int)min64(MR, nb - c0);
            int64_t p0, p1;
            panels_seen(s, b, b0 + c0, n, &p0, &p1);
            float *P = w.P + c0 * width, *dS = w.dS + c0 * width;
            product(w.qrows + c0, 1, n, w.kp, D, p0, p1, 0, D, P, width, 0, width);   /* S = q k^T */
            product(w.drows + c0, 1, n, w.vtp, D, p0, p1, 0, D, dS, width, 0, width); /* dp = dout v^T */
            for (int t = 0; t < n; ++t) {
                int64_t i = (b0 + c0 + t) / R, h = g * R + (b0 + c0 + t) % R, j0, j1;
                seen(s, b, i, &j0, &j1);
                float *Pt = P + t * width, *dSt = dS + t * width, dl = w.delta[c0 + t], sum;
                if (j0 >= j1)
                    memset(Pt + p0 * NR, 0, (size_t)(p1 - p0) * NR * sizeof(float));
                else
                    exp_row(Pt + p0 * NR, (p1 - p0) * NR, j0 - p0 * NR, j1 - p0 * NR, s->scale, lse[(b * s->H + h) * s->Lq + i], &sum);
                for (int64_t j = p0 * NR; j < p1 * NR; j += LANES) /* ds = p (dp - delta) x scale */
                    vstore(dSt + j, mul(mul(vload(Pt + j), sub(vload(dSt + j), splat(dl))), splat(s->scale)));
                if (p1 < q1) { /* the block's keys this row does not see: 0 for the products below */
                    memset(Pt + p1 * NR, 0, (size_t)(q1 - p1) * NR * sizeof(float));
                    memset(dSt + p1 * NR, 0, (size_t)(q1 - p1) * NR * sizeof(float));
                }
            }
            const float *ds[MR];
            for (int t = 0; t < n; ++t) ds[t] = dS + t * width;
            product(ds, 1, n, w.kd, Lk, 0, DP / NR, p0 * NR, min64(p1 * NR, Lk), w.dq, DP, 0, D); /* dq = ds k */
            for (int t = 0; t < n; ++t) {
                int64_t i = (b0 + c0 + t) / R, h = g * R + (b0 + c0 + t) % R;
                memcpy(dq + ((b * s->Lq + i) * s->H + h) * D, w.dq + t * DP, sizeof(float) * (size_t)D);
            }
        }
        /* dv += p^T dout and dk += ds^T q, for each MR keys over the block's rows from the first that sees them */
        int64_t i0 = b0 / R;
        for (int64_t j = q0 * NR, end = min64(q1 * NR, Lk); j < end; j += MR) {
            int n = (int)min64(MR, end - j);
            int64_t first = max64(0, j - off - i0) * R;
            if (first >= nb) break;
            const float *pa[MR], *da[MR];
            for (int t = 0; t < n; ++t) pa[t] = w.P + j + t, da[t] = w.dS + j + t;
            product(pa, width, n, w.dopan, nb, 0, DP / NR, first, nb, w.dv + j * DP, DP, 1, D);
            product(da, width, n, w.qpan, nb, 0, DP / NR, first, nb, w.dk + j * DP, DP, 1, D);
        }
    }
    for (int64_t j = 0; j < Lk; ++j) { /* the prompt's part per row (summed over the group by the caller), then the own */
        float *k_to = j < s->P ? dpk + ((b * s->Hkv + g) * s->P + j) * D : dk + ((b * s->Hkv + g) * s->C + j - s->P) * D;
        float *v_to = j < s->P ? dpv + ((b * s->Hkv + g) * s->P + j) * D : dv + ((b * s->Hkv + g) * s->C + j - s->P) * D;
        memcpy(k_to, w.dk + j * DP, sizeof(float) * (size_t)D);
        memcpy(v_to, w.dv + j * DP, sizeof(float) * (size_t)D);
    }
}

/* the forward's tensors, out [B, Lq, H, D] and dout (the same, contiguous), lse [B, H, Lq]: dq [B, Lq, H, D], dk and dv
   [B, Hkv, C, D], and dpk and dpv [B, Hkv, P, D] (each row's part of its prompt's gradients), contiguous; 0, else 1
   (shapes) or 2 (memory) */
int rlvr_causal_attention_backward(const float *q, const float *k, const float *v, const float *pk, const float *pv, const int64_t *shape,
                                   const int64_t *start, const int64_t *stop, float scale, const float *out, const float *dout, const float *lse,
                                   float *dq, float *dk, float *dv, float *dpk, float *dpv, int threads) {
    Shapes s;
    if (!shapes_of(&s, q, k, v, pk, pv, out, dout, shape, start, stop, scale)) return 1;
    int64_t B = s.B, H = s.H, Hkv = s.Hkv, Lk = s.Lk, D = s.D, width = round_up(Lk, NR), DP = round_up(D, NR);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        int64_t NB = BLOCK_ROWS / (H / Hkv) > 0 ? BLOCK_ROWS / (H / Hkv) * (H / Hkv) : H / Hkv;
        BackwardScratch w = {ALLOC(width * D), ALLOC(width * D), ALLOC(DP * Lk),  ALLOC(DP * NB),
                             ALLOC(DP * NB),   ALLOC(NB * width), ALLOC(NB * width), ALLOC(MR * DP),
                             ALLOC(Lk * DP),   ALLOC(Lk * DP),    ALLOC(NB),         malloc(sizeof(float *) * (size_t)Lk),
                             malloc(sizeof(float *) * (size_t)NB), malloc(sizeof(float *) * (size_t)NB), malloc(sizeof(float *) * (size_t)NB)};
        int ok = w.kp && w.vtp && w.kd && w.qpan && w.dopan && w.P && w.dS && w.dq && w.dk && w.dv && w.delta && w.keys && w.qrows &&
                 w.drows && w.orows;
        failed |= !ok;
#pragma omp for schedule(static)
        for (int64_t item = 0; item < B * Hkv; ++item)
            if (ok) backward_item(&s, item / Hkv, item % Hkv, lse, dq, dk, dv, dpk, dpv, w);
        free(w.kp), free(w.vtp), free(w.kd), free(w.qpan), free(w.dopan), free(w.P), free(w.dS), free(w.dq), free(w.dk);
        free(w.dv), free(w.delta), free(w.keys), free(w.qrows), free(w.drows), free(w.orows);
    }
    return failed ? 2 : 0;
}

int rlvr_causal_attention_vector_bits(void) { return lanes_vector_bits(); }
