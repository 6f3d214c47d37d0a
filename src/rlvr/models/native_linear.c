/* fp32 decode-shaped products y = x W^T (+ b) from a weight packed once into panels (native_linear.py builds and calls
   this file; rlvr.models.packed_linears measures per shape whether it runs them).

   Every output is one chain of fused multiply-adds over the input in order, from 0:

       y[i, j] = fma(x[i, K-1], W[j, K-1], ... fma(x[i, 1], W[j, 1], fma(x[i, 0], W[j, 0], 0)) ...)   (+ b[j], one add)

   whatever the rows, the threads, the blocking and the vector width, so a row's outputs are the same bits in a call of
   1 row or of 256, alone or beside other weights' rows (q, k and v packed as one weight give each its own bits).

   The weight [N, K] is packed into panels of NR = 3 vectors of output columns, each panel [K][NR] (the last padded
   with zeros): the register block is 4 rows x NR columns (12 accumulators), per input element 3 vector loads of the
   panel, 4 broadcasts of x and 12 multiply-adds, the panel streamed whole for each 4 rows (blocks of the input that
   fit L1 ran 0.9-1.0x as fast on an AMD EPYC: its prefetchers keep up). The threads share the (panel, rows chunk) pairs
   evenly (decode products have few rows, 16-256, and a narrow weight few panels). */

#include "native_common.h"
#include <math.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define W 16 /* floats per vector */
typedef __m512 vec;
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VSPLAT _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#define VADD _mm512_add_ps
#elif defined(__AVX2__) && defined(__FMA__)
#define W 8
typedef __m256 vec;
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VSPLAT _mm256_set1_ps
#define VZERO _mm256_setzero_ps
#define VADD _mm256_add_ps
#else
#define W 8 /* plain C (fmaf: the same chains, in software where the machine has no fused multiply-add) */
#endif

#define NR (3 * W) /* output columns per panel */
#define MR 4       /* rows per register block */

/* the panel width this build packs for */
int rlvr_linear_panel(void) { return NR; }

/* W [N, K] row-major into panels [ceil(N / NR)][K][NR], zeros past N */
void rlvr_linear_pack(const float *w, int64_t N, int64_t K, float *panels, int threads) {
    int64_t np = (N + NR - 1) / NR;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < np; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < NR; ++j) {
                int64_t n = p * NR + j;
                panels[(p * K + k) * NR + j] = n < N ? w[n * K + k] : 0.0f;
            }
}

#ifdef VLOAD
/* rows (at most MR, `rows` apart by ldx) x one panel's `cols` columns: the chains over all K inputs, + bias where
   not NULL, into y */
static inline __attribute__((always_inline)) void block(const float *x, int64_t ldx, int rows, const float *panel, int64_t K,
                                                        float *y, int64_t ldy, int cols, const float *bias) {
    const float *a0 = x, *a1 = rows > 1 ? x + ldx : x, *a2 = rows > 2 ? x + 2 * ldx : x, *a3 = rows > 3 ? x + 3 * ldx : x;
    vec acc[MR][3];
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < 3; ++j) acc[i][j] = VZERO();
    const float *b = panel;
    for (int64_t k = 0; k < K; ++k, b += NR) {
        vec b0 = VLOAD(b), b1 = VLOAD(b + W), b2 = VLOAD(b + 2 * W), s;
        __asm__("" : "+v"(b0), "+v"(b1), "+v"(b2)); /* in registers: GCC's znver tuning loads each 4 times (0.7x) */
        s = VSPLAT(a0[k]);
        acc[0][0] = VFMA(s, b0, acc[0][0]), acc[0][1] = VFMA(s, b1, acc[0][1]), acc[0][2] = VFMA(s, b2, acc[0][2]);
        s = VSPLAT(a1[k]);
        acc[1][0] = VFMA(s, b0, acc[1][0]), acc[1][1] = VFMA(s, b1, acc[1][1]), acc[1][2] = VFMA(s, b2, acc[1][2]);
        s = VSPLAT(a2[k]);
        acc[2][0] = VFMA(s, b0, acc[2][0]), acc[2][1] = VFMA(s, b1, acc[2][1]), acc[2][2] = VFMA(s, b2, acc[2][2]);
        s = VSPLAT(a3[k]);
        acc[3][0] = VFMA(s, b0, acc[3][0]), acc[3][1] = VFMA(s, b1, acc[3][1]), acc[3][2] = VFMA(s, b2, acc[3][2]);
    }
    float edge[NR];
    if (bias) {
        memset(edge, 0, sizeof edge);
        memcpy(edge, bias, (size_t)cols * sizeof(float));
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < 3; ++j) acc[i][j] = VADD(acc[i][j], VLOAD(edge + j * W));
    }
    for (int i = 0; i < rows; ++i) {
        if (cols == NR) {
            for (int j = 0; j < 3; ++j) VSTORE(y + i * ldy + j * W, acc[i][j]);
        } else {
            for (int j = 0; j < 3; ++j) VSTORE(edge + j * W, acc[i][j]);
            memcpy(y + i * ldy, edge, (size_t)cols * sizeof(float));
        }
    }
}

#else
/* as the vector block: the same chains, each fmaf rounding once */
static inline void block(const float *x, int64_t ldx, int rows, const float *panel, int64_t K, float *y, int64_t ldy, int cols,
                         const float *bias) {
    float acc[MR][NR] = {{0}};
    for (int64_t k = 0; k < K; ++k)
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < NR; ++j) acc[i][j] = fmaf(x[i * ldx + k], panel[k * NR + j], acc[i][j]);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) y[i * ldy + j] = bias ? acc[i][j] + bias[j] : acc[i][j];
}
#endif

/* y [M, N] (rows ldy apart) = x [M, K] (rows ldx apart) W^T (+ bias [N] where not NULL), W packed by rlvr_linear_pack */
int rlvr_linear(const float *x, int64_t ldx, int64_t M, int64_t K, const float *panels, int64_t N, const float *bias, float *y,
                int64_t ldy, int threads) {
    if (M < 1 || N < 1 || K < 1) return M < 0 || N < 0 || K < 0;
    int64_t np = (N + NR - 1) / NR, blocks = (M + MR - 1) / MR;
    int use = 2 * M * N * K < (1 << 20) ? 1 : threads; /* below ~1 MFLOP a thread fan-out costs more than it gives */
    /* each panel's rows in `use` chunks, the (panel, chunk) items in order split evenly among the threads: each thread
       a run of whole panels and at most two part ones (panels alone: 0.87-0.93x where they do not divide evenly) */
    int64_t chunks = use < blocks ? use : blocks;
    int64_t chunk_rows = (blocks + chunks - 1) / chunks * MR;
#pragma omp parallel for collapse(2) num_threads(use) schedule(static)
    for (int64_t p = 0; p < np; ++p)
        for (int64_t c = 0; c < chunks; ++c) {
            int64_t r1 = (c + 1) * chunk_rows < M ? (c + 1) * chunk_rows : M;
            int cols = (int)(N - p * NR < NR ? N - p * NR : NR);
            for (int64_t r = c * chunk_rows; r < r1; r += MR)
                block(x + r * ldx, ldx, (int)(r1 - r < MR ? r1 - r : MR), panels + p * K * NR, K, y + r * ldy + p * NR, ldy, cols,
                      bias ? bias + p * NR : NULL);
        }
    return 0;
}
