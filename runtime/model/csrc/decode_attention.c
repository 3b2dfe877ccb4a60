/* One decode token's GQA attention read straight from the stored KV format.
 *
 * Why native: with bf16/fp16/int8 KV, PyTorch's CPU path converts every layer's K/V to float32
 * (a write and a read of twice the stored bytes) before SDPA; at 2k tokens of context that is
 * most of a decode step (evals/kv_attention.py). Here each stored K and V row is read once,
 * converted in registers, and used by all G query heads of its KV head.
 *
 * Layout (runtime/cache/kv_format.py): K and V planes of one layer are [kv_heads, rows, hd]
 * with `head_stride` elements between heads and hd between rows; int8 planes come with float32
 * scales [kv_heads, rows, 1] (`scale_head_stride`). The request's keys are rows start..start+n-1,
 * or rows[0..n-1] when `rows` is not NULL (a request scattered over the pool).
 *
 * Work is split into (kv head, chunk of keys) tasks on torch's own OpenMP pool (this library
 * links the libgomp already loaded by torch): each task keeps its running max, sum and
 * weighted values (flash-decoding), merged per head at the end.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2, KV_I8 = 3 };
enum { MAX_HD = 256, MAX_G = 16, MAX_KV_HEADS = 64, CHUNK = 256 };

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One stored row -> hd floats (times its scale for int8). */
static inline void load_row(const void *plane, int dtype, int64_t at, int hd, float scale, float *dst) {
    switch (dtype) {
    case KV_F32: {
        const float *s = (const float *)plane + at;
        for (int d = 0; d < hd; d++) dst[d] = s[d];
        break;
    }
    case KV_BF16: {
        const uint16_t *s = (const uint16_t *)plane + at;
        for (int d = 0; d < hd; d++) dst[d] = bf16_to_f32(s[d]);
        break;
    }
    case KV_F16: {
        const _Float16 *s = (const _Float16 *)plane + at;
        for (int d = 0; d < hd; d++) dst[d] = (float)s[d];
        break;
    }
    default: {
        const int8_t *s = (const int8_t *)plane + at;
        for (int d = 0; d < hd; d++) dst[d] = (float)s[d] * scale;
        break;
    }
    }
}

/* One request's K/V for a step, for every layer (built once per step by runtime/model/decode_kernel.py;
 * the field order is its ctypes Structure's). Strides are in elements. */
typedef struct {
    const void *k, *v;       /* layer 0 of the K and V planes */
    const float *ks, *vs;    /* layer 0 of the int8 scales, else NULL */
    const int64_t *rows;     /* the n rows when scattered, else NULL: rows start..start+n-1 */
    int64_t start, n, layer_stride, head_stride, scale_layer_stride, scale_head_stride;
    int32_t kv_heads, g, hd, dtype, threads;
    float scale;             /* softmax scale, applied to q here */
} Plan;

typedef struct {
    const Plan *p;
    const void *k, *v;
    const float *ks, *vs;
    const float *q;          /* [g * hd] of this kv head, times the scale */
    const uint16_t *qb;      /* the same as bfloat16 bits where exact (else unused) */
} Head;

/* Weights below exp(-60) are taken as 0: they cannot move a float32 sum that holds the max's 1,
 * and a peaked head's far-off keys would otherwise give subnormal weights (and subnormal products
 * with V), which this CPU computes ~100x slower: a 2k-token step measured 4x slower with them. */
#define MIN_LOGIT (-60.0f)

/* In place: scores -> exp(score - max); *m = max, *l = their sum. */
static void softmax_part(float *s, int cnt, float *m, float *l) {
    float mx = -FLT_MAX;
    for (int j = 0; j < cnt; j++) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
    for (int j = 0; j < cnt; j++) {
        const float d = s[j] - mx;
        s[j] = d < MIN_LOGIT ? 0.0f : expf(fmaxf(d, MIN_LOGIT));  /* (libmvec's expf takes a slow path for far-off inputs) */
        sum += s[j];
    }
    *m = mx;
    *l = sum;
}

/* Keys [c0, c1) of one kv head: running max m[g], sum l[g] and unnormalised acc[g][hd]
 * (portable C; the compiler vectorises the loops over hd). */
static void chunk_c(const Head *a, int64_t c0, int64_t c1, float *m, float *l, float *acc) {
    const Plan *p = a->p;
    const int g = p->g, hd = p->hd;
    float scores[MAX_G][CHUNK];
    float row[MAX_HD];
    const int cnt = (int)(c1 - c0);
    for (int j = 0; j < cnt; j++) {
        int64_t r = p->rows ? p->rows[c0 + j] : p->start + c0 + j;
        load_row(a->k, p->dtype, r * hd, hd, a->ks ? a->ks[r] : 1.0f, row);
        for (int x = 0; x < g; x++) {
            const float *qx = a->q + x * hd;
            float s = 0.0f;
            for (int d = 0; d < hd; d++) s += qx[d] * row[d];
            scores[x][j] = s;
        }
    }
    for (int x = 0; x < g; x++) softmax_part(scores[x], cnt, m + x, l + x);
    memset(acc, 0, sizeof(float) * g * hd);
    for (int j = 0; j < cnt; j++) {
        int64_t r = p->rows ? p->rows[c0 + j] : p->start + c0 + j;
        load_row(a->v, p->dtype, r * hd, hd, a->vs ? a->vs[r] : 1.0f, row);
        for (int x = 0; x < g; x++) {
            float e = scores[x][j];
            float *ax = acc + x * hd;
            for (int d = 0; d < hd; d++) ax[d] += e * row[d];
        }
    }
}

#ifdef __AVX512F__
#include <immintrin.h>

/* 16 floats of a stored row (int8: levels only; scales are applied to scores and weights). */
static inline __attribute__((always_inline)) __m512 load16(const void *plane, const int dtype, int64_t at) {
    switch (dtype) {
    case KV_F32:
        return _mm512_loadu_ps((const float *)plane + at);
    case KV_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)plane + at));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case KV_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)plane + at)));
    default:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)plane + at))));
    }
}

/* r[i] = sum of v[i]'s 16 lanes, for 16 vectors at once (~3 shuffles or adds per sum instead of
 * ~8 for one horizontal reduction each). */
static inline __m512 hsum16(const __m512 *v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xdd));
    __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
}

/* Rows are fetched this many keys ahead: a 2k-token step's K/V (24-94 MB) does not stay in
 * cache between steps, and without prefetches the loops ran at ~10 GB/s, the memory's latency
 * rather than its bandwidth (~30 GB/s here). */
enum { PREFETCH_ROWS = 64 };

static inline __attribute__((always_inline)) void prefetch_row(const void *plane, const Plan *p, int64_t j,
                                                                const int64_t row_bytes) {
    if (j >= p->n) return;
    const char *at = (const char *)plane + (p->rows ? p->rows[j] : p->start + j) * row_bytes;
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(at + b, 0, 2);
}

/* chunk_c with AVX-512, for hd a multiple of 16 (<= 256); inlined per (dtype, hd, g) below so
 * the loops over hd and g unroll and the accumulators stay in registers. `bf16_dot`: q is exact
 * in bfloat16 (bf16 activations), so the scores of bf16 keys are AVX512-BF16 dot products of
 * the stored pairs with fp32 accumulation: no conversion of K at all, and the same products. */
static inline __attribute__((always_inline)) void chunk_avx(const Head *a, int64_t c0, int64_t c1, float *m,
                                                            float *l, float *acc, const int dtype, const int hd,
                                                            const int g, const int bf16_dot) {
    const Plan *p = a->p;
    const int nv = hd / 16;
    float scores[MAX_G][CHUNK] __attribute__((aligned(64)));
    __m512 part[MAX_G][16];
    const int cnt = (int)(c1 - c0);
    const int64_t row_bytes = (int64_t)hd * (dtype == KV_F32 ? 4 : dtype == KV_I8 ? 1 : 2);
    for (int j = 0; j < PREFETCH_ROWS && j < cnt; j++) prefetch_row(a->k, p, c0 + j, row_bytes);
    for (int j0 = 0; j0 < cnt; j0 += 16) {
        const int jn = cnt - j0 < 16 ? cnt - j0 : 16;
        for (int jj = 0; jj < 16; jj++) {
            if (jj >= jn) {
                for (int x = 0; x < g; x++) part[x][jj] = _mm512_setzero_ps();
                continue;
            }
            prefetch_row(a->k, p, c0 + j0 + jj + PREFETCH_ROWS, row_bytes);
            prefetch_row(a->v, p, c0 + j0 + jj, row_bytes);  /* read in the second pass */
            const int64_t r = p->rows ? p->rows[c0 + j0 + jj] : p->start + c0 + j0 + jj;
#ifdef __AVX512BF16__
            if (bf16_dot) {
                const uint16_t *kr = (const uint16_t *)a->k + r * hd;
                __m512i k2[MAX_HD / 32];
                for (int c = 0; c < hd / 32; c++) k2[c] = _mm512_loadu_si512((const void *)(kr + 32 * c));
                for (int x = 0; x < g; x++) {
                    __m512 t = _mm512_setzero_ps();
                    for (int c = 0; c < hd / 32; c++)
                        t = _mm512_dpbf16_ps(t, (__m512bh)_mm512_loadu_si512((const void *)(a->qb + x * hd + 32 * c)),
                                             (__m512bh)k2[c]);
                    part[x][jj] = t;
                }
                continue;
            }
#endif
            __m512 k[MAX_HD / 16];
            for (int c = 0; c < nv; c++) k[c] = load16(a->k, dtype, r * hd + 16 * c);
            for (int x = 0; x < g; x++) {
                __m512 t = _mm512_mul_ps(_mm512_loadu_ps(a->q + x * hd), k[0]);
                for (int c = 1; c < nv; c++) t = _mm512_fmadd_ps(_mm512_loadu_ps(a->q + x * hd + 16 * c), k[c], t);
                part[x][jj] = t;
            }
        }
        for (int x = 0; x < g; x++) _mm512_store_ps(&scores[x][j0], hsum16(part[x]));
    }
    if (a->ks)
        for (int j = 0; j < cnt; j++) {
            float sc = a->ks[p->rows ? p->rows[c0 + j] : p->start + c0 + j];
            for (int x = 0; x < g; x++) scores[x][j] *= sc;
        }
    for (int x = 0; x < g; x++) softmax_part(scores[x], cnt, m + x, l + x);
    if (a->vs)
        for (int j = 0; j < cnt; j++) {
            float sc = a->vs[p->rows ? p->rows[c0 + j] : p->start + c0 + j];
            for (int x = 0; x < g; x++) scores[x][j] *= sc;
        }
    __m512 o[MAX_G][MAX_HD / 16];
    for (int x = 0; x < g; x++)
        for (int c = 0; c < nv; c++) o[x][c] = _mm512_setzero_ps();
    for (int j = 0; j < PREFETCH_ROWS && j < cnt; j++) prefetch_row(a->v, p, c0 + j, row_bytes);
    for (int j = 0; j < cnt; j++) {
        prefetch_row(a->v, p, c0 + j + PREFETCH_ROWS, row_bytes);
        const int64_t r = p->rows ? p->rows[c0 + j] : p->start + c0 + j;
        __m512 v[MAX_HD / 16];
        for (int c = 0; c < nv; c++) v[c] = load16(a->v, dtype, r * hd + 16 * c);
        for (int x = 0; x < g; x++) {
            const __m512 e = _mm512_set1_ps(scores[x][j]);
            for (int c = 0; c < nv; c++) o[x][c] = _mm512_fmadd_ps(e, v[c], o[x][c]);
        }
    }
    for (int x = 0; x < g; x++)
        for (int c = 0; c < nv; c++) _mm512_storeu_ps(acc + x * hd + 16 * c, o[x][c]);
}

/* Instances: SmolLM2's shape (hd 64, 3 query heads per kv head) unrolled, and any other shape. */
#define CHUNK_AVX(NAME, DTYPE, HD, G, DOT)                                                            \
    static void NAME(const Head *a, int64_t c0, int64_t c1, float *m, float *l, float *acc) {        \
        chunk_avx(a, c0, c1, m, l, acc, DTYPE, HD, G, DOT);                                          \
    }
CHUNK_AVX(f32_64_3, KV_F32, 64, 3, 0)
CHUNK_AVX(bf16_64_3, KV_BF16, 64, 3, 0)
CHUNK_AVX(bf16dot_64_3, KV_BF16, 64, 3, 1)
CHUNK_AVX(f16_64_3, KV_F16, 64, 3, 0)
CHUNK_AVX(i8_64_3, KV_I8, 64, 3, 0)
CHUNK_AVX(f32_any, KV_F32, a->p->hd, a->p->g, 0)
CHUNK_AVX(bf16_any, KV_BF16, a->p->hd, a->p->g, 0)
CHUNK_AVX(bf16dot_any, KV_BF16, a->p->hd, a->p->g, 1)
CHUNK_AVX(f16_any, KV_F16, a->p->hd, a->p->g, 0)
CHUNK_AVX(i8_any, KV_I8, a->p->hd, a->p->g, 0)
#endif

typedef void (*ChunkFn)(const Head *, int64_t, int64_t, float *, float *, float *);

static ChunkFn pick(const Plan *p, int bf16_dot) {
#ifdef __AVX512F__
    static const ChunkFn fixed[4] = {f32_64_3, bf16_64_3, f16_64_3, i8_64_3};
    static const ChunkFn any[4] = {f32_any, bf16_any, f16_any, i8_any};
    const int dot = bf16_dot && p->dtype == KV_BF16;
    if (p->hd == 64 && p->g == 3) return dot ? bf16dot_64_3 : fixed[p->dtype];
    if (p->hd % 16 == 0) return dot && p->hd % 32 == 0 ? bf16dot_any : any[p->dtype];
#else
    (void)p;
    (void)bf16_dot;
#endif
    return chunk_c;
}

/* Whether every q value is a bfloat16 (its low 16 bits are zero). */
static int exact_bf16(const float *q, int count) {
    for (int i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, q + i, sizeof u);
        if (u & 0xffffu) return 0;
    }
    return 1;
}

static size_t elem_size(int dtype) { return dtype == KV_F32 ? 4 : dtype == KV_I8 ? 1 : 2; }

/* q times the softmax scale into qs, and its bfloat16 bits into qb where every value is exact in
 * bfloat16; returns whether they are. One out-of-line copy for decode and prefill alike: a query's
 * arithmetic must not depend on which of them computes it. */
__attribute__((noinline)) static int scale_q(const Plan *p, const float *q, int nq, float *qs, uint16_t *qb) {
    for (int i = 0; i < nq; i++) qs[i] = q[i] * p->scale;
    const int bf16_dot = p->dtype == KV_BF16 && exact_bf16(qs, nq);
    for (int i = 0; bf16_dot && i < nq; i++) {
        uint32_t u;
        memcpy(&u, qs + i, sizeof u);
        qb[i] = (uint16_t)(u >> 16);
    }
    return bf16_dot;
}

/* One kv head's chunk results (each [m(g) | l(g) | acc(g * hd)], in key order) -> its g query
 * heads' outputs [g * hd]: the flash-decoding merge, in chunk order. Out of line for the same
 * reason as scale_q. */
__attribute__((noinline)) static void merge_head(const float *part, int64_t chunks, int g, int hd, float *out) {
    const int64_t per = (int64_t)g * (hd + 2);
    for (int x = 0; x < g; x++) {
        float mx = -FLT_MAX;
        for (int64_t c = 0; c < chunks; c++) {
            float mc = part[c * per + x];
            mx = mc > mx ? mc : mx;
        }
        float *o = out + (int64_t)x * hd;
        memset(o, 0, sizeof(float) * hd);
        float sum = 0.0f;
        for (int64_t c = 0; c < chunks; c++) {
            const float *w = part + c * per;
            const float d = w[x] - mx;
            const float e = d < MIN_LOGIT ? 0.0f : expf(fmaxf(d, MIN_LOGIT));
            sum += e * w[g + x];
            const float *ac = w + 2 * g + x * hd;
            for (int d = 0; d < hd; d++) o[d] += e * ac[d];
        }
        for (int d = 0; d < hd; d++) o[d] /= sum;
    }
}

static int plan_ok(const Plan *p) {
    return p->n > 0 && p->g <= MAX_G && p->hd <= MAX_HD && p->dtype >= KV_F32 && p->dtype <= KV_I8 &&
           p->kv_heads <= MAX_KV_HEADS;
}

/* Each kv head's K/V planes and scales of layer `layer` (q pointers left for the caller). */
static void layer_heads(const Plan *p, int64_t layer, Head *heads) {
    const size_t es = elem_size(p->dtype);
    for (int h = 0; h < p->kv_heads; h++) {
        const int64_t off = layer * p->layer_stride + h * p->head_stride;
        const int64_t soff = layer * p->scale_layer_stride + h * p->scale_head_stride;
        heads[h] = (Head){p, (const char *)p->k + off * es, (const char *)p->v + off * es,
                          p->ks ? p->ks + soff : NULL, p->vs ? p->vs + soff : NULL, NULL, NULL};
    }
}

/* Layer `layer` of the plan: q [kv_heads * g * hd] -> out [kv_heads * g * hd]. Returns 0, or -1
 * for a plan this kernel does not take (the caller checks plans before use). */
int decode_attention(const Plan *p, int64_t layer, const float *q, float *out) {
    if (!plan_ok(p)) return -1;
    const int kvh = p->kv_heads, g = p->g, hd = p->hd;
    const int64_t n = p->n;
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
    const int64_t tasks = chunks * kvh;
    const int64_t per = (int64_t)g * (hd + 2);
    const int nq = kvh * g * hd;
    /* q (scaled), q as bf16 bits, and each task's partial results, in one allocation */
    float *qs = malloc(sizeof(float) * (nq + (nq + 1) / 2 + tasks * per) + 64);
    if (!qs) return -1;
    uint16_t *qb = (uint16_t *)(qs + nq);
    float *part = qs + nq + (nq + 1) / 2;
    const ChunkFn fn = pick(p, scale_q(p, q, nq, qs, qb));
    Head heads[MAX_KV_HEADS];
    layer_heads(p, layer, heads);
    for (int h = 0; h < kvh; h++) heads[h].q = qs + h * g * hd, heads[h].qb = qb + h * g * hd;
#pragma omp parallel for schedule(static) num_threads(p->threads) if (tasks > 1 && p->threads > 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t c0 = (t % chunks) * CHUNK, c1 = c0 + CHUNK < n ? c0 + CHUNK : n;
        float *w = part + t * per;
        fn(&heads[t / chunks], c0, c1, w, w + g, w + 2 * g);
    }
    for (int h = 0; h < kvh; h++) merge_head(part + h * chunks * per, chunks, g, hd, out + (int64_t)h * g * hd);
    free(qs);
    return 0;
}

/* A prefill chunk's attention with every query's arithmetic that of decode_attention: query i
 * (plan position first + i) attends keys 0..first+i, in the same CHUNK-key parts, with the same
 * chunk functions and merge, so a token's output is the same bits whether it is computed here, in
 * another chunk, with a cached prefix, or as a decode step (cold == cached on the fast path).
 * q and out are [count][kv_heads * g * hd]; the keys of all count queries are stored already.
 * Work is split into (query, kv head) tasks; a task runs its chunks in key order. */
int prefill_attention(const Plan *p, int64_t layer, int64_t first, int64_t count, const float *q, float *out) {
    if (!plan_ok(p) || first < 0 || count <= 0 || first + count > p->n) return -1;
    const int kvh = p->kv_heads, g = p->g, hd = p->hd;
    const int nq = kvh * g * hd;
    const int64_t per = (int64_t)g * (hd + 2), most = (first + count + CHUNK - 1) / CHUNK;
    /* each query scaled, as bf16 bits, and whether those are exact: one allocation */
    float *qs = malloc(sizeof(float) * (size_t)(count * nq) + sizeof(int) * (size_t)count +
                       sizeof(uint16_t) * (size_t)(count * nq) + 64);
    if (!qs) return -1;
    int *dot = (int *)(qs + count * nq);
    uint16_t *qb = (uint16_t *)(dot + count);
    for (int64_t i = 0; i < count; i++) dot[i] = scale_q(p, q + i * nq, nq, qs + i * nq, qb + i * nq);
    Head heads[MAX_KV_HEADS];
    layer_heads(p, layer, heads);
    const int64_t tasks = count * kvh;
    int failed = 0;
#pragma omp parallel num_threads(p->threads) if (tasks > 1 && p->threads > 1)
    {
        float *part = malloc(sizeof(float) * (size_t)(most * per));
        if (!part) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (!part) continue;
            const int64_t i = t / kvh, n = first + i + 1, chunks = (n + CHUNK - 1) / CHUNK;
            const int h = (int)(t % kvh);
            Head a = heads[h];
            a.q = qs + i * nq + h * g * hd, a.qb = qb + i * nq + h * g * hd;
            const ChunkFn fn = pick(p, dot[i]);
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t c0 = c * CHUNK, c1 = c0 + CHUNK < n ? c0 + CHUNK : n;
                float *w = part + c * per;
                fn(&a, c0, c1, w, w + g, w + 2 * g);
            }
            merge_head(part, chunks, g, hd, out + i * nq + (int64_t)h * g * hd);
        }
        free(part);
    }
    free(qs);
    return failed ? -1 : 0;
}

/* y[m][n] = scale[n] * sum_k x[m][k] * w[n][k]: an int8 weight matrix [n_out, k] with one float32
 * scale per output row, times m float32 rows (decode steps: m is the number of requests; prompt
 * logprobs: a chunk's rows, four at a time).
 * The lm_head of the quantized models (49152 x 576 int8) is the largest matrix a decode step reads;
 * PyTorch's int8 kernel measured ~11 GB/s on this CPU, this one ~25 (the memory's speed). Each
 * weight row is converted once, in registers, for all m rows; rows are split over the threads. */
static inline __attribute__((always_inline)) void int8_rows(const float *x, const int8_t *w, const float *scale,
                                                            float *y, int64_t n0, int64_t n1, int64_t n_out,
                                                            int64_t k, const int m) {
#ifdef __AVX512F__
    if (k % 16 == 0) {
        /* OUT weight rows at a time: each output's sum is one chain of FMAs in d order (its bits do
         * not depend on the blocking), and OUT * m independent chains hide the FMA latency that a
         * single row's chain waited on; the rows LM_PREFETCH_ROWS ahead are fetched meanwhile. */
        enum { OUT = 4, LM_PREFETCH_ROWS = 8 };
        int64_t n = n0;
        for (; n + OUT <= n1; n += OUT) {
            const int8_t *wr = w + n * k;
            for (int64_t b = 0; b < OUT * k; b += 64)
                if (n + OUT + LM_PREFETCH_ROWS < n_out) __builtin_prefetch(wr + (OUT + LM_PREFETCH_ROWS) * k + b, 0, 2);
            __m512 acc[OUT][4];
            for (int o = 0; o < OUT; o++)
                for (int r = 0; r < m; r++) acc[o][r] = _mm512_setzero_ps();
            for (int64_t d = 0; d < k; d += 16)
                for (int o = 0; o < OUT; o++) {
                    const __m512 wv =
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wr + o * k + d))));
                    for (int r = 0; r < m; r++) acc[o][r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * k + d), wv, acc[o][r]);
                }
            for (int o = 0; o < OUT; o++)
                for (int r = 0; r < m; r++) y[r * n_out + n + o] = _mm512_reduce_add_ps(acc[o][r]) * scale[n + o];
        }
        for (; n < n1; n++) {
            const int8_t *wr = w + n * k;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int64_t d = 0; d < k; d += 16) {
                const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wr + d))));
                for (int r = 0; r < m; r++) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * k + d), wv, acc[r]);
            }
            for (int r = 0; r < m; r++) y[r * n_out + n] = _mm512_reduce_add_ps(acc[r]) * scale[n];
        }
        return;
    }
#endif
    for (int64_t n = n0; n < n1; n++)
        for (int r = 0; r < m; r++) {
            const float *xr = x + r * k;
            const int8_t *wr = w + n * k;
            float s = 0.0f;
            for (int64_t d = 0; d < k; d++) s += xr[d] * (float)wr[d];
            y[r * n_out + n] = s * scale[n];
        }
}

int int8_linear(const float *x, const int8_t *w, const float *scale, float *y, int64_t m, int64_t n_out,
                int64_t k, int32_t threads) {
    if (m <= 0 || k <= 0) return -1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n_out >= 256)
    for (int64_t n0 = 0; n0 < n_out; n0 += 64) {
        const int64_t n1 = n0 + 64 < n_out ? n0 + 64 : n_out;
        /* rows in groups of 4 while these 64 weight rows stay in cache; a row's outputs are the
         * same chains whichever group it falls in */
        for (int64_t r0 = 0; r0 < m; r0 += 4) {
            const float *xr = x + r0 * k;
            float *yr = y + r0 * n_out;
            switch (m - r0 < 4 ? m - r0 : 4) {  /* a constant in each copy: accumulators in registers */
            case 1: int8_rows(xr, w, scale, yr, n0, n1, n_out, k, 1); break;
            case 2: int8_rows(xr, w, scale, yr, n0, n1, n_out, k, 2); break;
            case 3: int8_rows(xr, w, scale, yr, n0, n1, n_out, k, 3); break;
            default: int8_rows(xr, w, scale, yr, n0, n1, n_out, k, 4); break;
            }
        }
    }
    return 0;
}

/* The same product for bf16 rows (the quantized models' activations), y[m][n] = scale[n] *
 * sum_k x[m][k] * w[n][k], by two kernels that give the same bits, so a row's logits do not
 * depend on how many rows share the call (the exact path's contract), and the bits int8_linear
 * gives the same rows as float32 (its chain): the logits did not change when this came in.
 * - many rows: AVX512-BF16 pair dot products (twice the float32 FMA's multiply-adds per
 *   instruction), each weight widened once per block of up to 8 rows;
 * - one or two rows, where the weights' bytes bound the time: int8_linear's float32 FMAs, one
 *   weight widened per FMA (the pair kernel's widening and shuffle cost more per weight than
 *   one row's products: one row measured 0.41 ms there, 0.34-0.37 here; from 3 rows on the pair
 *   kernel is faster).
 * One chain per output lane i: acc += x[d+i] * w[d+i] for d = 0, 16, 32, ... in order, each
 * product exact (bf16 times |w| <= 127: 16 significant bits) and each sum rounded once; then one
 * horizontal sum and the scale. vdpbf16ps adds its lane's odd element's product, then its even
 * one's, each rounded once, so the pair kernel feeds it x and w interleaved per 32 inputs as
 * (d+16+i, d+i) (tests/runtime/test_decode_kernel.py checks the two kernels' bits against each
 * other). Returns -1 where the CPU has no AVX512-BF16 or k % 32 (the caller then takes
 * int8_linear, for every row count). */
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
/* The bf16 of 32 small integers at p, interleaved (p[i], p[16+i]) per 32-bit lane: their float32
 * bits end in 16 zeros, so each bf16 is its float's high half (one shuffle). */
static inline __m512bh int8x32_pairs(const int8_t *p) {
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    const __m512i pick = _mm512_set_epi16(31, 63, 29, 61, 27, 59, 25, 57, 23, 55, 21, 53, 19, 51, 17, 49, 15, 47, 13, 45, 11, 43, 9, 41, 7, 39, 5, 37, 3, 35, 1, 33);
    return (__m512bh)_mm512_permutex2var_epi16(_mm512_castps_si512(lo), pick, _mm512_castps_si512(hi));
}

/* Outputs n..n+OUT-1 for R rows of interleaved bf16 x. */
static inline __attribute__((always_inline)) void pairs_outs(const uint16_t *xi, const int8_t *w, const float *scale,
                                                             float *y, int64_t n, int64_t n_out, int64_t k,
                                                             const int R, const int OUT) {
    __m512 acc[8][4];
    for (int r = 0; r < R; r++)
        for (int o = 0; o < OUT; o++) acc[r][o] = _mm512_setzero_ps();
    for (int64_t d = 0; d < k; d += 32) {
        __m512bh wv[4];
        for (int o = 0; o < OUT; o++) wv[o] = int8x32_pairs(w + (n + o) * k + d);
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xi + r * k + d));
            for (int o = 0; o < OUT; o++) acc[r][o] = _mm512_dpbf16_ps(acc[r][o], wv[o], xv);
        }
    }
    for (int r = 0; r < R; r++)
        for (int o = 0; o < OUT; o++) y[r * n_out + n + o] = _mm512_reduce_add_ps(acc[r][o]) * scale[n + o];
}

/* Outputs n0..n1-1 of R rows: OUT at a time (the rows 8 ahead fetched meanwhile), then one by one. */
static inline __attribute__((always_inline)) void pairs_block(const uint16_t *xi, const int8_t *w, const float *scale,
                                                              float *y, int64_t n0, int64_t n1, int64_t n_out,
                                                              int64_t k, const int R, const int OUT) {
    int64_t n = n0;
    for (; n + OUT <= n1; n += OUT) {
        if (n + 2 * OUT + 8 <= n_out)
            for (int64_t b = 0; b < OUT * k; b += 64) __builtin_prefetch(w + (n + OUT + 8) * k + b, 0, 2);
        pairs_outs(xi, w, scale, y, n, n_out, k, R, OUT);
    }
    for (; n < n1; n++) pairs_outs(xi, w, scale, y, n, n_out, k, R, 1);
}

#define FEW_ROWS 2 /* up to this many rows int8_linear runs: the weights' bytes bound them */
/* inputs below 2^-100 are taken as 0: then every product is a multiple of 2^-107 and no sum is a
 * denormal, which vdpbf16ps would flush and an FMA would not (setting FTZ/DAZ instead cost one
 * row's call ~15%); their products are 1e-28 of a logit's */
#define TINY_EXP 27

/* a bf16 input, 0 below 2^-100 (TINY_EXP) */
static inline uint16_t flushed(uint16_t v) { return ((v >> 7) & 0xFF) < TINY_EXP ? 0 : v; }

int int8_linear_bf16(const uint16_t *x, const int8_t *w, const float *scale, float *y, int64_t m, int64_t n_out,
                     int64_t k, int32_t threads) {
    if (m <= 0 || k <= 0 || k % 32) return -1;
    const int pairs = m > FEW_ROWS;
    /* int8_linear's float32 rows, or the pair kernel's interleaved (d+16+i, d+i) */
    void *xs = malloc((size_t)(m * k) * (pairs ? sizeof(uint16_t) : sizeof(float)));
    if (!xs) return -1;
    for (int64_t r = 0; r < m; r++)
        for (int64_t d = 0; d < k; d += 32)
            for (int i = 0; i < 32; i++) {
                const uint16_t v = flushed(x[r * k + d + i]);
                if (pairs) {
                    ((uint16_t *)xs)[r * k + d + (i < 16 ? 2 * i + 1 : 2 * (i - 16))] = v;
                } else {
                    const union { uint32_t u; float f; } f = {.u = (uint32_t)v << 16};
                    ((float *)xs)[r * k + d + i] = f.f;
                }
            }
    if (!pairs) {
        const int rc = int8_linear((const float *)xs, w, scale, y, m, n_out, k, threads);
        free(xs);
        return rc;
    }
    const uint16_t *xi = (const uint16_t *)xs;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n_out >= 256)
    for (int64_t n0 = 0; n0 < n_out; n0 += 64) {
        const int64_t n1 = n0 + 64 < n_out ? n0 + 64 : n_out;
        for (int64_t r0 = 0; r0 < m; r0 += 8) {
            float *yr = y + r0 * n_out;
            switch (m - r0 < 8 ? m - r0 : 8) { /* constants in each copy: accumulators in registers */
            case 1: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 1, 4); break;
            case 2: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 2, 4); break;
            case 3: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 3, 4); break;
            case 4: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 4, 4); break;
            case 5: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 5, 2); break;
            case 6: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 6, 2); break;
            case 7: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 7, 2); break;
            default: pairs_block(xi + r0 * k, w, scale, yr, n0, n1, n_out, k, 8, 2); break;
            }
        }
    }
    free(xs);
    return 0;
}
#else
int int8_linear_bf16(const uint16_t *x, const int8_t *w, const float *scale, float *y, int64_t m, int64_t n_out,
                     int64_t k, int32_t threads) {
    (void)x, (void)w, (void)scale, (void)y, (void)m, (void)n_out, (void)k, (void)threads;
    return -1;
}
#endif

static inline float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  /* nearest, ties to even (as torch) */
    memcpy(&f, &u, sizeof f);
    return f;
}

/* y = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w) per row: HF's LlamaRMSNorm on bfloat16
 * activations as the compact forward computes it (fp32 math, cast back, then the weight), for the
 * few rows of a decode step: one call instead of the ~6 ops (~35 us on this CPU) torch takes. */
int rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, int64_t m, int64_t k, float eps) {
    for (int64_t r = 0; r < m; r++) {
        const uint16_t *xr = x + r * k;
        float ss = 0.0f;
        for (int64_t d = 0; d < k; d++) {
            float v = bf16_to_f32(xr[d]);
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)k + eps);
        for (int64_t d = 0; d < k; d++) {
            float v = bf16_round(bf16_round(bf16_to_f32(xr[d]) * inv) * bf16_to_f32(w[d]));
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            y[r * k + d] = (uint16_t)(u >> 16);
        }
    }
    return 0;
}

/* ---- the rest of a decode layer's attention: rope, the K/V store, attention, in one call ----
 * What the compact forward does between its qkv and o projections for a one-token request, as
 * ~20 small torch ops per layer (~3 ms of a 12 ms step at 2k tokens, measured), here in one call
 * with the same bits: every rounding the torch ops make is made here, in the same order, and
 * this section is compiled without fast-math (IEEE division, no fused multiply-adds), so the K/V
 * rows stored and the query attended with are those of runtime/model/model.py's torch path. */
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

enum { ACT_F32 = 0, ACT_BF16 = 1 };

static inline float act_load(const void *base, int act, int64_t i) {
    return act == ACT_BF16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline float bf16_exact(float f) {  /* IEEE nearest-even to bfloat16 (finite values) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* An activation-dtype result: torch rounds each op's float result to the tensor's dtype. */
static inline float act_round(float f, int act) { return act == ACT_BF16 ? bf16_exact(f) : f; }

/* HF's rotate_half rope of one head, x * cos + rotate_half(x) * sin, one rounding per op. */
static void rope_head_scalar(const void *h, int act, int64_t off, const void *cs, const void *sn, int hd, float *dst) {
    const int half = hd / 2;
    for (int d = 0; d < hd; d++) {
        const float x = act_load(h, act, off + d);
        const float rot = d < half ? -act_load(h, act, off + d + half) : act_load(h, act, off + d - half);
        const float a = act_round(x * act_load(cs, act, d), act);
        const float b = act_round(rot * act_load(sn, act, d), act);
        dst[d] = act_round(a + b, act);
    }
}

#ifdef __AVX512F__
static inline __m512 bf16_load16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m512 bf16_round16(__m512 f) { /* bf16_exact on 16 lanes: the same integer steps */
    const __m512i u = _mm512_castps_si512(f);
    const __m512i t = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    return _mm512_castsi512_ps(_mm512_and_si512(t, _mm512_set1_epi32((int)0xffff0000u)));
}
#endif

/* rope_head_scalar's arithmetic 16 lanes at a time for bf16 activations (each lane the same IEEE
 * products, sums and roundings: the same bits); scalar for float32 activations or odd sizes. */
static void rope_head(const void *h, int act, int64_t off, const void *cs, const void *sn, int hd, float *dst) {
#ifdef __AVX512F__
    if (act == ACT_BF16 && hd % 32 == 0) {
        const uint16_t *x = (const uint16_t *)h + off, *c = cs, *s = sn;
        const int half = hd / 2;
        const __m512 neg = _mm512_set1_ps(-0.0f);
        for (int d = 0; d < hd; d += 16) {
            const __m512 xv = bf16_load16(x + d);
            const __m512 rot = d < half ? _mm512_xor_ps(bf16_load16(x + d + half), neg) : bf16_load16(x + d - half);
            const __m512 a = bf16_round16(_mm512_mul_ps(xv, bf16_load16(c + d)));
            const __m512 b = bf16_round16(_mm512_mul_ps(rot, bf16_load16(s + d)));
            _mm512_storeu_ps(dst + d, bf16_round16(_mm512_add_ps(a, b)));
        }
        return;
    }
#endif
    rope_head_scalar(h, act, off, cs, sn, hd, dst);
}

/* One token-head row into a stored plane (kv_format.py's store: a cast, or int8 with the row's
 * absmax scale: scale = max|x| / 127 (at least FLT_MIN), levels = round-half-even(x / scale)). */
static void store_row(void *plane, float *scales, int dtype, int64_t at, int hd, const float *x) {
    switch (dtype) {
    case KV_F32:
        memcpy((float *)plane + at, x, sizeof(float) * hd);
        return;
    case KV_BF16:
#ifdef __AVX512F__
        if (hd % 16 == 0) {
            for (int d = 0; d < hd; d += 16) {
                const __m512i y = _mm512_castps_si512(bf16_round16(_mm512_loadu_ps(x + d)));
                _mm256_storeu_si256((__m256i *)((uint16_t *)plane + at + d), _mm512_cvtepi32_epi16(_mm512_srli_epi32(y, 16)));
            }
            return;
        }
#endif
        for (int d = 0; d < hd; d++) {
            uint32_t u;
            const float f = bf16_exact(x[d]);
            memcpy(&u, &f, sizeof u);
            ((uint16_t *)plane)[at + d] = (uint16_t)(u >> 16);
        }
        return;
    case KV_F16:
        for (int d = 0; d < hd; d++) ((_Float16 *)plane)[at + d] = (_Float16)x[d];
        return;
    default: {
        float mx = 0.0f;
        for (int d = 0; d < hd; d++) mx = fabsf(x[d]) > mx ? fabsf(x[d]) : mx;
        float sc = mx / 127.0f;
        sc = sc < FLT_MIN ? FLT_MIN : sc;
        *scales = sc;
        for (int d = 0; d < hd; d++) ((int8_t *)plane)[at + d] = (int8_t)nearbyintf(x[d] / sc);
        return;
    }
    }
}

/* One request's share of a step's attention: its scaled query, its heads and where its tasks
 * and their partial results start in the step's lists. */
typedef struct {
    float *q, *qs;
    uint16_t *qb;
    ChunkFn fn;
    int64_t chunks, first_task;
    float *part;
    Head heads[MAX_KV_HEADS];
} Req;

static int layer_plan_ok(const Plan *p) { return plan_ok(p) && p->hd % 2 == 0; }

/* Rope on the request's q and K, K and V stored at its newest row (plan position n - 1); q
 * (rotated, float) into q. */
static void rope_store(const Plan *p, int64_t layer, const char *hr, int act, const char *ci, const char *si,
                       float *q) {
    const int kvh = p->kv_heads, hd = p->hd, nq = kvh * p->g * hd;
    for (int x = 0; x < kvh * p->g; x++) rope_head(hr, act, (int64_t)x * hd, ci, si, hd, q + x * hd);
    const int64_t r = p->rows ? p->rows[p->n - 1] : p->start + p->n - 1;
    float row[MAX_HD];
    for (int kh = 0; kh < kvh; kh++) {
        const int64_t off = layer * p->layer_stride + kh * p->head_stride + r * hd;
        const int64_t soff = layer * p->scale_layer_stride + kh * p->scale_head_stride + r;
        rope_head(hr, act, (int64_t)nq + kh * hd, ci, si, hd, row);
        store_row((void *)p->k, p->ks ? (float *)p->ks + soff : NULL, p->dtype, off, hd, row);
        for (int d = 0; d < hd; d++) row[d] = act_load(hr, act, (int64_t)nq + (int64_t)kvh * hd + kh * hd + d);
        store_row((void *)p->v, p->vs ? (float *)p->vs + soff : NULL, p->dtype, off, hd, row);
    }
}

/* A request's merged outputs, rounded to the activation dtype, into its row of out. */
static void merge_out(const Plan *p, const Req *rq, int act, char *orow) {
    const int g = p->g, hd = p->hd, nq = p->kv_heads * g * hd;
    const int64_t per = (int64_t)g * (hd + 2);
    float *o = rq->qs; /* the scaled q is spent: the merged outputs go in its place */
    for (int x = 0; x < p->kv_heads; x++)
        merge_head(rq->part + x * rq->chunks * per, rq->chunks, g, hd, o + (int64_t)x * g * hd);
    for (int d = 0; d < nq; d++) {
        if (act == ACT_BF16) {
            uint32_t u;
            const float v = bf16_exact(o[d]);
            memcpy(&u, &v, sizeof u);
            ((uint16_t *)orow)[d] = (uint16_t)(u >> 16);
        } else {
            ((float *)orow)[d] = o[d];
        }
    }
}

/* For each of `count` one-token requests: its row of h ([heads*hd | kv_heads*hd K | kv_heads*hd V]
 * in the activation dtype, the qkv projection's output), rope on q and K with its position's
 * cos/sin rows ([hd]), K and V stored at the request's newest row (plan position n - 1), then
 * layer `layer`'s attention into its row of out ([heads*hd], activation dtype). Rows of h, cs,
 * sn and out are `h_stride`, `hd` and `heads*hd` elements apart. Returns 0, or -1 if a plan or
 * the activation dtype is not one this takes (then nothing is stored).
 *
 * One parallel region per layer for every request (a 16-request step ran 480 fork/joins when each
 * request had its own): each request's rope and K/V store, then every (kv head, chunk) task, then
 * each request's merge, split over the threads. The rope and store were a serial prologue that
 * kept the other thread waiting (~40% of a 16-request layer, AMD EPYC); they now run in parallel
 * and, for bf16 activations, 16 lanes at a time with the same IEEE ops and roundings. Each task,
 * merge and rounding is decode_attention's, so a token's bits do not depend on the requests
 * beside it. */
int decode_layer(const Plan *const *plans, int64_t count, int64_t layer, int32_t act, const void *h,
                 int64_t h_stride, const void *cs, const void *sn, void *out) {
    if (act != ACT_F32 && act != ACT_BF16) return -1;
    if (count <= 0) return 0;
    const size_t as = act == ACT_BF16 ? 2 : 4;
    size_t floats = 0;
    int64_t tasks = 0;
    for (int64_t i = 0; i < count; i++) {
        const Plan *p = plans[i];
        if (!layer_plan_ok(p)) return -1;
        const int64_t nq = (int64_t)p->kv_heads * p->g * p->hd, chunks = (p->n + CHUNK - 1) / CHUNK;
        floats += (size_t)(2 * nq + (nq + 1) / 2 + chunks * p->kv_heads * p->g * (p->hd + 2));
        tasks += chunks * p->kv_heads;
    }
    Req *reqs = malloc(sizeof(Req) * (size_t)count + sizeof(int32_t) * (size_t)tasks + sizeof(float) * floats + 64);
    if (!reqs) return -1;
    int32_t *owner = (int32_t *)(reqs + count); /* each task's request */
    float *f = (float *)(owner + tasks);
    int64_t t0 = 0;
    for (int64_t i = 0; i < count; i++) { /* where each request's q, parts and tasks go */
        const Plan *p = plans[i];
        Req *rq = &reqs[i];
        const int kvh = p->kv_heads, g = p->g, hd = p->hd, nq = kvh * g * hd;
        rq->q = f;
        rq->qs = f + nq;
        rq->qb = (uint16_t *)(rq->qs + nq);
        rq->part = rq->qs + nq + (nq + 1) / 2;
        rq->chunks = (p->n + CHUNK - 1) / CHUNK;
        rq->first_task = t0;
        f = rq->part + rq->chunks * kvh * g * (hd + 2);
        for (int64_t t = 0; t < rq->chunks * kvh; t++) owner[t0 + t] = (int32_t)i;
        t0 += rq->chunks * kvh;
    }
    const int threads = plans[0]->threads;
    /* one parallel region, three loops: each request's rope and store, every attention task, each
     * request's merge (a request's pieces are the same code whichever thread runs them) */
#pragma omp parallel num_threads(threads) if (threads > 1 && tasks > 1)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < count; i++) {
            const Plan *p = plans[i];
            Req *rq = &reqs[i];
            const int g = p->g, hd = p->hd, nq = p->kv_heads * g * hd;
            rope_store(p, layer, (const char *)h + i * h_stride * as, act, (const char *)cs + i * hd * as,
                       (const char *)sn + i * hd * as, rq->q);
            rq->fn = pick(p, scale_q(p, rq->q, nq, rq->qs, rq->qb));
            layer_heads(p, layer, rq->heads);
            for (int x = 0; x < p->kv_heads; x++) rq->heads[x].q = rq->qs + x * g * hd, rq->heads[x].qb = rq->qb + x * g * hd;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            const Req *rq = &reqs[owner[t]];
            const Plan *p = plans[owner[t]];
            const int64_t local = t - rq->first_task, per = (int64_t)p->g * (p->hd + 2);
            const int64_t c0 = (local % rq->chunks) * CHUNK, c1 = c0 + CHUNK < p->n ? c0 + CHUNK : p->n;
            float *w = rq->part + local * per;
            rq->fn(&rq->heads[local / rq->chunks], c0, c1, w, w + p->g, w + 2 * p->g);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < count; i++) merge_out(plans[i], &reqs[i], act, (char *)out + i * (int64_t)plans[i]->kv_heads * plans[i]->g * plans[i]->hd * as);
    }
    free(reqs);
    return 0;
}
#pragma GCC pop_options

/* ---- silu(gate) * up on a decode step's few bf16 rows ([m][gate | up], `inter` each) ----
 * torch computes silu on bf16 as float(x) / (1 + exp(-float(x))) with its vectorised exp (SLEEF's
 * expf16_u10, passed in by runtime/model/decode_kernel.py from the loaded libtorch), rounds to bf16,
 * then multiplies by up and rounds again: the same here, in one call instead of three ops
 * (chunk, silu, mul). decode_kernel.py checks every one of the 65536 bf16 inputs against torch
 * at load and keeps torch's ops if any differs. */
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")
#ifdef __AVX512F__
typedef __m512 (*Exp16)(__m512);
#endif

int silu_mul_bf16(const uint16_t *gu, uint16_t *out, int64_t m, int64_t inter, const void *exp16) {
#ifdef __AVX512F__
    if (!exp16 || inter % 16) return -1;
    const Exp16 ex = (Exp16)exp16;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < inter; j += 16) {
            const __m512 g = bf16_load16(gu + r * 2 * inter + j), u = bf16_load16(gu + r * 2 * inter + inter + j);
            const __m512 s = bf16_round16(_mm512_div_ps(g, _mm512_add_ps(one, ex(_mm512_xor_ps(g, _mm512_set1_ps(-0.0f))))));
            const __m512i y = _mm512_castps_si512(bf16_round16(_mm512_mul_ps(s, u)));
            _mm256_storeu_si256((__m256i *)(out + r * inter + j), _mm512_cvtepi32_epi16(_mm512_srli_epi32(y, 16)));
        }
    return 0;
#else
    (void)gu, (void)out, (void)m, (void)inter, (void)exp16;
    return -1;
#endif
}
#pragma GCC pop_options

/* ---- y = x w^T + b in float32, each output summed in one order whatever the shapes ----
 * For --enable-deterministic-inference with float32 weights: MKL's sgemm picks its kernel and
 * its K blocking from the call's shape, so a row's results change with the number of rows beside
 * it (measured on an Intel Xeon: 1-15 rows, and 64-160 rows with K = 1536, differ from 1100).
 * Here y[m][n] is always the same chain: 16 lanes of FMAs over k in steps of 16, in k order, a
 * fixed reduction of the lanes, then the K % 16 tail in k order, then the bias; a thread computes
 * whole outputs. Tiles of 4 rows x 4 outputs keep 16 chains in flight. */
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")
static inline float lanes_sum(const float *l) {  /* ((l0+l1)+(l2+l3))+... pairwise, fixed */
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = l[2 * i] + l[2 * i + 1];
    for (int i = 0; i < 4; i++) b[i] = a[2 * i] + a[2 * i + 1];
    for (int i = 0; i < 2; i++) c[i] = b[2 * i] + b[2 * i + 1];
    return c[0] + c[1];
}

static inline float tail_add(float s, const float *x, const float *w, int64_t k0, int64_t k) {
    for (int64_t d = k0; d < k; d++) s = s + x[d] * w[d];
    return s;
}

#ifdef __AVX512F__
static inline __attribute__((always_inline)) void tile_body(const float *x, const float *w, const float *bias,
                                                            float *y, int64_t m0, const int mr, int64_t n0,
                                                            const int nr, int64_t n_out, int64_t k) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    const int64_t kv = k / 16 * 16;
    for (int64_t d = 0; d < kv; d += 16) {
        __m512 xv[4], wv[4];
        for (int i = 0; i < mr; i++) xv[i] = _mm512_loadu_ps(x + (m0 + i) * k + d);
        for (int j = 0; j < nr; j++) wv[j] = _mm512_loadu_ps(w + (n0 + j) * k + d);
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv[j], acc[i][j]);
    }
    float lanes[16];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            _mm512_storeu_ps(lanes, acc[i][j]);
            float s = tail_add(lanes_sum(lanes), x + (m0 + i) * k, w + (n0 + j) * k, kv, k);
            y[(m0 + i) * n_out + n0 + j] = bias ? s + bias[n0 + j] : s;
        }
}

static void tile_f32(const float *x, const float *w, const float *bias, float *y, int64_t m0, int64_t mr,
                     int64_t n0, int64_t nr, int64_t n_out, int64_t k) {
    if (mr == 4 && nr == 4) /* constant bounds: the 16 accumulators stay in registers */
        tile_body(x, w, bias, y, m0, 4, n0, 4, n_out, k);
    else if (mr == 1 && nr == 4) /* a decode step's one row */
        tile_body(x, w, bias, y, m0, 1, n0, 4, n_out, k);
    else
        tile_body(x, w, bias, y, m0, (int)mr, n0, (int)nr, n_out, k);
}
#else
static void tile_f32(const float *x, const float *w, const float *bias, float *y, int64_t m0, int64_t mr,
                     int64_t n0, int64_t nr, int64_t n_out, int64_t k) {
    const int64_t kv = k / 16 * 16;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const float *xr = x + (m0 + i) * k, *wr = w + (n0 + j) * k;
            float lanes[16] = {0};
            for (int64_t d = 0; d < kv; d += 16)
                for (int l = 0; l < 16; l++) lanes[l] = lanes[l] + xr[d + l] * wr[d + l];
            float s = tail_add(lanes_sum(lanes), xr, wr, kv, k);
            y[(m0 + i) * n_out + n0 + j] = bias ? s + bias[n0 + j] : s;
        }
}
#endif

/* x [m, k], w [n_out, k], bias [n_out] or NULL -> y [m, n_out]; all float32, contiguous. */
int linear_f32_invariant(const float *x, const float *w, const float *bias, float *y, int64_t m, int64_t n_out,
                         int64_t k, int32_t threads) {
    if (m <= 0 || n_out <= 0 || k <= 0) return -1;
    enum { ROWS = 64 };  /* rows per pass: their x stays in cache while w streams by */
    for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
        const int64_t r1 = r0 + ROWS < m ? r0 + ROWS : m;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n_out >= 64)
        for (int64_t n0 = 0; n0 < n_out; n0 += 4) {
            const int64_t nr = n_out - n0 < 4 ? n_out - n0 : 4;
            for (int64_t m0 = r0; m0 < r1; m0 += 4)
                tile_f32(x, w, bias, y, m0, r1 - m0 < 4 ? r1 - m0 : 4, n0, nr, n_out, k);
        }
    }
    return 0;
}
#pragma GCC pop_options
