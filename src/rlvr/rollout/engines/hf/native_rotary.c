/* The lean decode's rotation of the new token's queries and keys and its write into the KV buffers, in one pass
   (native_rotary.py builds and calls this file).

   For each row: q and k rotated (x cos + roll(x, D/2) sin~, sin~ = sin with its first half negated), the rotated
   queries written out as floats, the rotated keys and the values written at one slot of the row's buffers (floats, or
   bf16 rounded to nearest even, as torch casts). In torch that is ten ops a layer (four multiplies, two rolls, two
   adds, two strided copies), each a pass with its own dispatch and thread fan-out over a few kilobytes.

   Every output has torch's bits: each value is the same two products and one sum, in float, from the same inputs
   (bf16 widened exactly), built with -ffp-contract=off (rlvr.models.native_build) so that no product and sum fuse. */

#include "native_common.h"

#define MAX_D RLVR_MAX_D /* the longest head the kernel takes (a row on the stack) */
#define AHEAD 2   /* rows whose buffer slots are fetched ahead */

/* the kernel's arguments (described below) */
#define ROTATE_ARGS                                                                                                    \
    const void *q, int64_t qs0, int64_t qs1, const void *k, int64_t ks0, int64_t ks1, const void *v, int64_t vs0,      \
        int64_t vs1, int q_bf16, int k_bf16, int v_bf16, const float *cos, const float *sin, int64_t cs, float *q_out, void *kbuf,           \
        int64_t kb0, int64_t kb1, void *vbuf, int64_t vb0, int64_t vb1, const int64_t *slot_at, int buf_bf16,          \
        int64_t n, int64_t Hq, int64_t Hkv

/* row r's heads; inlined with D a constant for the common head sizes, whose loops the compiler then lays out whole */
static inline __attribute__((always_inline)) void rotate_write_row(ROTATE_ARGS, int64_t D, int64_t r) {
    size_t qe = q_bf16 ? 2 : 4, ke = k_bf16 ? 2 : 4, ve = v_bf16 ? 2 : 4, out = buf_bf16 ? 2 : 4;
    float x[MAX_D], y[MAX_D];
    /* the slots a few rows on: each a line of its own far from the last, so their misses overlap */
    if (r + AHEAD < n && !(slot_at && slot_at[r + AHEAD] < 0)) {
        int64_t ka = slot_at ? slot_at[r + AHEAD] : (r + AHEAD) * kb0, va = slot_at ? slot_at[r + AHEAD] : (r + AHEAD) * vb0;
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t b = 0; b < D * (int64_t)out; b += 64) {
                __builtin_prefetch((char *)kbuf + (ka + h * kb1) * out + b, 1);
                __builtin_prefetch((char *)vbuf + (va + h * vb1) * out + b, 1);
            }
    }
    const int64_t ko = slot_at ? slot_at[r] : r * kb0, vo = slot_at ? slot_at[r] : r * vb0;
    const float *c = cos + r * cs, *s = sin + r * cs;
    for (int64_t h = 0; h < Hq; ++h) {
        rlvr_widen_row((const char *)q + (r * qs0 + h * qs1) * qe, q_bf16, D, x);
        rlvr_rotate_row(x, c, s, D, q_out + (r * Hq + h) * D);
    }
    if (ko < 0) /* a padding token of a chunk: q rotated, nothing written */
        return;
    for (int64_t h = 0; h < Hkv; ++h) {
        rlvr_widen_row((const char *)k + (r * ks0 + h * ks1) * ke, k_bf16, D, x);
        rlvr_rotate_row(x, c, s, D, y);
        rlvr_store_row(y, D, (char *)kbuf + (ko + h * kb1) * out, buf_bf16);
        rlvr_widen_row((const char *)v + (r * vs0 + h * vs1) * ve, v_bf16, D, x);
        rlvr_store_row(x, D, (char *)vbuf + (vo + h * vb1) * out, buf_bf16);
    }
}

/* q [n, Hq, D], k and v [n, Hkv, D]: strides (row, head) in elements, D contiguous, each floats or bf16 (q_bf16, k_bf16, v_bf16);
   cos, sin [n, D] floats, row stride cs; q_out [n, Hq, D] floats, contiguous; kbuf, vbuf: the buffers' slot being
   written, strides (row, head) in elements, D contiguous, floats or bf16 (buf_bf16); slot_at [n] or NULL: row r's slot
   at element slot_at[r] of both buffers (multi-turn episodes: a buffer row and slot of each row's own; negative: row r
   is a chunk's padding, its q rotated and nothing written), NULL: at r x kb0 and r x vb0. Returns 0, or -1 for D > MAX_D or odd. */
int rlvr_rotate_write(ROTATE_ARGS, int64_t D, int threads) {
    if (D > MAX_D || D % 2) return -1;
    /* a thread fan-out costs more than a small step's whole pass */
    int use = n * (Hq + 2 * Hkv) * D >= (1 << 14) ? threads : 1;
#define ROTATE_CALL q, qs0, qs1, k, ks0, ks1, v, vs0, vs1, q_bf16, k_bf16, v_bf16, cos, sin, cs, q_out, kbuf, kb0, kb1, vbuf, vb0, vb1, slot_at, buf_bf16, n, Hq, Hkv
#pragma omp parallel for num_threads(use) schedule(static)
    for (int64_t r = 0; r < n; ++r) {
        if (D == 64)
            rotate_write_row(ROTATE_CALL, 64, r);
        else if (D == 128)
            rotate_write_row(ROTATE_CALL, 128, r);
        else
            rotate_write_row(ROTATE_CALL, D, r);
    }
    return 0;
}
