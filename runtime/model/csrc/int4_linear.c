/* int4 weight-only linear layers on bf16 rows: the exact fast path's matmul (runtime/model/quant.py).
 *
 * Why a kernel of our own: torch's CPU int4 kernel dequantizes every weight to float32 with one
 * FMA per weight and row block and sums with one FMA per weight and row: many rows run at ~170
 * GFLOP/s on 2 cores of an AMD EPYC, this kernel at ~355 (a prompt chunk's matmuls in half the
 * time), and a 4-row decode step 1.5x faster.
 * Here the bf16 pair dot product (AVX512-BF16 `vdpbf16ps`) multiplies two weights by two inputs
 * per lane, and the group's scale and zero are applied once per group of G inputs:
 *
 *   y[r][n] = sum over groups g, in order:  y = fma(inner, scale[g][n], y); y = fma(sa, zero[g][n], y)
 *     inner = the group's pair dot products of x[r][k] (bf16) and (q[n][k] - 8) (exact in bf16),
 *             k pairs in order from a zeroed fp32 lane (vdpbf16ps: odd element, then even)
 *     sa    = x[r]'s sum over the group, k in order, in fp32
 *
 * since w = (q - 8) * scale + zero.  Every output's chain is the same whichever rows or tiles
 * share the call (each micro-kernel shape runs the same instructions per output), so a token's
 * row is the same bits in a decode step, a prefill chunk or a batch: the exact path's contract.
 *
 * Layout (built by quant.py's `Int4Tiles`): the outputs in tiles of 16, the tiles in panels of
 * PANEL; per panel, per 4 inputs k..k+3, each tile's 32 bytes one after another (one stream of
 * bytes per block of tiles): byte 2i+d holds q[n0+i][k+d] in its low nibble and q[n0+i][k+2+d] in
 * its high one, so one 32-byte load widened to 16-bit lanes gives two k pairs' weights for 16
 * outputs in vdpbf16ps's layout. Scales and zeros: bf16 [tiles][groups][2][16].
 *
 * Without AVX512-BF16 the library has no int4 kernel (`int4_linear_available` is 0) and the
 * engine keeps torch's, which is row-invariant too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

int int4_linear_available(void) { return 1; }

#define MAX_MR 4
#define MAX_NR 4
#define PANEL 4     /* tiles stored interleaved per quad: one stream of weights per block */
#define PREFETCH 16 /* 4-input steps ahead */

/* 4 inputs of one tile: 32 bytes widened to 16-bit lanes; the low nibbles are the first pair's
 * levels, the high ones the second's; the table gives the bf16 of level - 8 (exact). */
static inline __attribute__((always_inline)) void weights4(const uint8_t *p, __m512i lut, __m512bh *b0,
                                                           __m512bh *b1) {
    __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    *b0 = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(words, _mm512_set1_epi16(0x0F)), lut);
    *b1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), lut);
}

static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

typedef struct {
    const uint16_t *x;   /* the block's first row */
    int64_t ldx;
    const float *sums;   /* its rows' group sums, [row][group] */
    int64_t groups, group;
    const uint8_t *w;    /* its first tile's bytes at input 0 */
    int64_t stride;      /* bytes per 4 inputs in its panel */
    const uint16_t *sz;  /* its first tile's scales and zeros */
} Block;

/* Groups g..g+GI-1 of a block of MR rows and NR tiles, added to acc in group order. The groups'
 * inner sums are independent chains, so a one-row block interleaves two to hide the dot
 * product's latency; each output's instructions stay the same. */
/* Group g of a block of MR rows and NR tiles, added to acc. */
static inline __attribute__((always_inline)) void group_step(const Block *b, int64_t g, __m512 acc[MAX_MR][MAX_NR],
                                                             const int MR, const int NR) {
    const __m512i lut = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (short)0x40E0,
                                         (short)0x40C0, (short)0x40A0, (short)0x4080, (short)0x4040,
                                         (short)0x4000, (short)0x3F80, 0, (short)0xBF80, (short)0xC000,
                                         (short)0xC040, (short)0xC080, (short)0xC0A0, (short)0xC0C0,
                                         (short)0xC0E0, (short)0xC100);
    __m512 inner[MAX_MR][MAX_NR];
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) inner[r][t] = _mm512_setzero_ps();
    for (int64_t k = g * b->group; k < (g + 1) * b->group; k += 4) {
        const uint8_t *q = b->w + (k / 4) * b->stride;
        __m512bh b0[MAX_NR], b1[MAX_NR];
        _mm_prefetch((const char *)(q + PREFETCH * b->stride), _MM_HINT_T0);
        if (NR > 2) _mm_prefetch((const char *)(q + PREFETCH * b->stride + 64), _MM_HINT_T0);
        for (int t = 0; t < NR; t++) weights4(q + t * 32, lut, &b0[t], &b1[t]);
        for (int r = 0; r < MR; r++) {
            int32_t p0, p1;
            memcpy(&p0, b->x + r * b->ldx + k, 4);
            memcpy(&p1, b->x + r * b->ldx + k + 2, 4);
            const __m512bh a0 = (__m512bh)_mm512_set1_epi32(p0), a1 = (__m512bh)_mm512_set1_epi32(p1);
            for (int t = 0; t < NR; t++) {
                inner[r][t] = _mm512_dpbf16_ps(inner[r][t], b0[t], a0);
                inner[r][t] = _mm512_dpbf16_ps(inner[r][t], b1[t], a1);
            }
        }
    }
    for (int t = 0; t < NR; t++) {
        const uint16_t *s = b->sz + t * b->groups * 32 + g * 32;
        const __m512 scale = bf16x16(s), zero = bf16x16(s + 16);
        for (int r = 0; r < MR; r++) {
            acc[r][t] = _mm512_fmadd_ps(inner[r][t], scale, acc[r][t]);
            acc[r][t] = _mm512_fmadd_ps(_mm512_set1_ps(b->sums[r * b->groups + g]), zero, acc[r][t]);
        }
    }
}

/* rows r0..r0+MR of x times tiles t0..t0+NR: MR and NR are constants at every call site, so the
 * compiler builds one register-blocked copy per shape; each output's instructions are the same
 * in every copy. */
static inline __attribute__((always_inline)) void micro(const uint16_t *x, int64_t ldx, const float *sums,
                                                        int64_t groups, const uint8_t *w, const uint16_t *sz,
                                                        int64_t k, int64_t group, uint16_t *y, int64_t ldy,
                                                        int64_t tiles, int64_t t0, const int MR, const int NR) {
    const int64_t panel = t0 / PANEL * PANEL, nt = tiles - panel < PANEL ? tiles - panel : PANEL;
    const Block b = {x, ldx, sums, groups, group, w + panel * k * 8 + (t0 - panel) * 32, nt * 32,
                     sz + t0 * groups * 32};
    __m512 acc[MAX_MR][MAX_NR];
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) group_step(&b, g, acc, MR, NR);
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++)
            _mm256_storeu_si256((__m256i *)(y + r * ldy + (t0 + t) * 16), (__m256i)_mm512_cvtneps_pbh(acc[r][t]));
}

#define MICRO(MR, NR) micro(x, ldx, sums, groups, w, sz, k, group, y, ldy, tiles, t0, MR, NR)

static void rows_tiles(const uint16_t *x, int64_t ldx, const float *sums, int64_t groups, const uint8_t *w,
                       const uint16_t *sz, int64_t k, int64_t group, uint16_t *y, int64_t ldy, int64_t tiles,
                       int64_t t0, int mr, int nr) {
    switch (mr * 8 + nr) {
    case 1 * 8 + 1: MICRO(1, 1); break;
    case 1 * 8 + 2: MICRO(1, 2); break;
    case 1 * 8 + 3: MICRO(1, 3); break;
    case 1 * 8 + 4: MICRO(1, 4); break;
    case 2 * 8 + 1: MICRO(2, 1); break;
    case 2 * 8 + 2: MICRO(2, 2); break;
    case 2 * 8 + 3: MICRO(2, 3); break;
    case 2 * 8 + 4: MICRO(2, 4); break;
    case 3 * 8 + 1: MICRO(3, 1); break;
    case 3 * 8 + 2: MICRO(3, 2); break;
    case 3 * 8 + 3: MICRO(3, 3); break;
    case 3 * 8 + 4: MICRO(3, 4); break;
    case 4 * 8 + 1: MICRO(4, 1); break;
    case 4 * 8 + 2: MICRO(4, 2); break;
    case 4 * 8 + 3: MICRO(4, 3); break;
    default: MICRO(4, 4); break;
    }
}

/* Each row's group sums, k in order (one loop for every row: the same order for all). */
static void group_sums(const uint16_t *x, int64_t m, int64_t k, int64_t group, float *sums) {
    const int64_t groups = k / group;
    for (int64_t r = 0; r < m; r++)
        for (int64_t g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int64_t j = g * group; j < (g + 1) * group; j++) {
                union { uint32_t u; float f; } v = {.u = (uint32_t)x[r * k + j] << 16};
                s += v.f;
            }
            sums[r * groups + g] = s;
        }
}

/* x [m, k] bf16 times the int4 layout of an [n, k] matrix: y [m, n] bf16. Returns 0, or -1 for
 * shapes it does not take (n % 16, k % group, group % 4) or no memory. */
int int4_linear(const uint16_t *x, const uint8_t *w, const uint16_t *sz, uint16_t *y, int64_t m, int64_t n,
                int64_t k, int64_t group, int32_t threads) {
    if (n % 16 || group % 4 || k % group || m < 1) return -1;
    const int64_t groups = k / group, tiles = n / 16;
    float *sums = malloc(sizeof(float) * (size_t)(m * groups));
    if (!sums) return -1;
    group_sums(x, m, k, group, sums);
    /* each thread a contiguous run of tiles (its weights read once from memory), every row */
    const int nt = threads > 1 && tiles > 1 ? threads : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int part = 0; part < nt; part++) {
        const int64_t lo = tiles * part / nt, hi = tiles * (part + 1) / nt;
        for (int64_t t0 = lo; t0 < hi;) {
            /* up to MAX_NR tiles, within one panel */
            const int64_t end = (t0 / PANEL + 1) * PANEL < hi ? (t0 / PANEL + 1) * PANEL : hi;
            const int nr = end - t0 < MAX_NR ? (int)(end - t0) : MAX_NR;
            for (int64_t r0 = 0; r0 < m; r0 += MAX_MR) {
                const int mr = m - r0 < MAX_MR ? (int)(m - r0) : MAX_MR;
                rows_tiles(x + r0 * k, k, sums + r0 * groups, groups, w, sz, k, group, y + r0 * n, n, tiles, t0, mr, nr);
            }
            t0 += nr;
        }
    }
    free(sums);
    return 0;
}

#else

int int4_linear_available(void) { return 0; }

int int4_linear(const uint16_t *x, const uint8_t *w, const uint16_t *sz, uint16_t *y, int64_t m, int64_t n,
                int64_t k, int64_t group, int32_t threads) {
    (void)x, (void)w, (void)sz, (void)y, (void)m, (void)n, (void)k, (void)group, (void)threads;
    return -1;
}

#endif
