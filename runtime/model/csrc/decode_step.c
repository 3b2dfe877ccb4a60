/* A decode step's whole layer in one call, for int4 models (runtime/model/model.py `_layer_calls`).
 *
 * Why: with the int4 matmul native (int4_linear.c), a one-token step's layer is ~10 small calls
 * from Python (norm, qkv, rope + K/V store + attention, o, residual add, norm, gate_up, silu * up,
 * down, residual add), ~5 us of Python and dispatch each: ~1.5 ms of a ~9 ms step at 2k tokens.
 * Here the same kernels run back to back from C. Every piece is the function the multi-row path
 * calls (rms_norm_bf16, int4_linear, decode_layer, silu_mul_bf16), and the residual adds round as
 * torch's bf16 add does (fp32 sum, then nearest-even to bf16), so a token's bits do not depend on
 * which path computed it: the exact path's contract (tests/runtime/test_exact_fast_path.py). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, int64_t m, int64_t k, float eps);
int int4_linear(const uint16_t *x, const uint8_t *w, const uint16_t *sz, uint16_t *y, int64_t m, int64_t n,
                int64_t k, int64_t group, int32_t threads);
int decode_layer(const void *const *plans, int64_t count, int64_t layer, int32_t act, const void *h,
                 int64_t h_stride, const void *cs, const void *sn, void *out);
int silu_mul_bf16(const uint16_t *gu, uint16_t *out, int64_t m, int64_t inter, const void *exp16);

/* One layer's weights: runtime/model/decode_kernel.py's _Int4Layer, field for field. */
typedef struct {
    const uint16_t *ln1, *ln2;  /* bf16 [hidden] */
    const uint8_t *w[4];        /* qkv, o, gate_up, down: int4_linear.c's tiles */
    const uint16_t *sz[4];
    int64_t n[4];               /* their output sizes */
    int64_t group;
} Int4Layer;

enum { QKV = 0, O = 1, GATE_UP = 2, DOWN = 3 };

/* x += d, rounded as torch's bf16 add: fp32 sum, nearest-even (finite values). */
static void add_bf16(uint16_t *x, const uint16_t *d, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        union { uint32_t u; float f; } a = {.u = (uint32_t)x[i] << 16}, b = {.u = (uint32_t)d[i] << 16}, s;
        s.f = a.f + b.f;
        x[i] = (uint16_t)((s.u + 0x7fffu + ((s.u >> 16) & 1u)) >> 16);
    }
}

/* Layer `layer` of `count` one-token requests: x [count, hidden] bf16 in place; cs / sn each
 * request's rope rows [count, hd] bf16; heads * hd attention outputs per request. Returns 0, or
 * the first failing piece's code (nothing of x is changed unless every piece ran). */
int decode_layer_int4(const void *const *plans, int64_t count, int64_t layer, const Int4Layer *L, uint16_t *x,
                      int64_t hidden, int64_t attn, float eps, const uint16_t *cs, const uint16_t *sn,
                      const void *exp16, int32_t threads) {
    const int64_t inter = L->n[GATE_UP] / 2;
    const int64_t widest = L->n[QKV] > L->n[GATE_UP] ? L->n[QKV] : L->n[GATE_UP];
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)(count * (2 * hidden + widest + attn + inter)));
    if (!buf) return -1;
    uint16_t *h = buf, *d = h + count * hidden, *wide = d + count * hidden, *a = wide + count * widest;
    uint16_t *act = a + count * attn;
    int rc = rms_norm_bf16(x, L->ln1, h, count, hidden, eps);
    if (!rc) rc = int4_linear(h, L->w[QKV], L->sz[QKV], wide, count, L->n[QKV], hidden, L->group, threads);
    if (!rc) rc = decode_layer(plans, count, layer, 1 /* ACT_BF16 */, wide, L->n[QKV], cs, sn, a);
    if (!rc) rc = int4_linear(a, L->w[O], L->sz[O], d, count, hidden, attn, L->group, threads);
    if (!rc) {
        /* the second half writes x: from here on nothing can fail for a shape reason */
        uint16_t *x2 = malloc(sizeof(uint16_t) * (size_t)(count * hidden));
        rc = x2 ? 0 : -1;
        if (!rc) {
            memcpy(x2, x, sizeof(uint16_t) * (size_t)(count * hidden));
            add_bf16(x2, d, count * hidden);
            rc = rms_norm_bf16(x2, L->ln2, h, count, hidden, eps);
        }
        if (!rc)
            rc = int4_linear(h, L->w[GATE_UP], L->sz[GATE_UP], wide, count, L->n[GATE_UP], hidden, L->group, threads);
        if (!rc) rc = silu_mul_bf16(wide, act, count, inter, exp16);
        if (!rc) rc = int4_linear(act, L->w[DOWN], L->sz[DOWN], d, count, hidden, inter, L->group, threads);
        if (!rc) {
            add_bf16(x2, d, count * hidden);
            memcpy(x, x2, sizeof(uint16_t) * (size_t)(count * hidden));
        }
        free(x2);
    }
    free(buf);
    return rc;
}
