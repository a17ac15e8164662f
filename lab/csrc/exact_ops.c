/* The exact engine's per-row operations (lab/exact.py): everything in a decoder layer except
 * its four packed bfloat16 products, which oneDNN computes.
 *
 * Exact speculative decoding needs the target to compute the same bits for a position whether
 * it is scored alone (AR) or inside a chain or tree. Library kernels choose their blocking, and
 * so their order of additions, by the shape of the whole call; every function here computes
 * each row (and, in attention, each row and head) on its own, in an order fixed by the row
 * alone, so nothing depends on how many rows come with it. Doing these steps in C rather than
 * as a dozen torch operations per layer also removes most of the per-call overhead that a
 * one-token forward would otherwise pay.
 *
 * Layouts: the residual stream x is float32 [n, hidden]; bfloat16 tensors are uint16 bits;
 * the KV cache is float32 [kv_heads, capacity, head_dim] per layer. head_dim and hidden must
 * be multiples of 16 (checked in Python).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* round to nearest even, as torch does; NaN stays NaN */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* a fixed-order sum of a[c] * b[c]: 16 lanes, then the lanes folded in halves */
static float dot(const float *a, const float *b, int64_t d) {
    float lane[LANES] = {0};
    for (int64_t c = 0; c < d; c += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += a[c + l] * b[c + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* x += delta (if given); out = RMSNorm(x) * weight in bfloat16 (out = x if weight is NULL:
 * a model whose final norm is the identity) */
void add_norm(float *x, const uint16_t *delta, const float *weight, float eps, uint16_t *out,
              int64_t n, int64_t hidden, int threads) {
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        float *xr = x + r * hidden;
        if (delta)
            for (int64_t c = 0; c < hidden; c++) xr[c] += from_bf16(delta[r * hidden + c]);
        float inv = 1.0f;
        if (weight) inv = 1.0f / sqrtf(dot(xr, xr, hidden) / (float)hidden + eps);
        for (int64_t c = 0; c < hidden; c++) out[r * hidden + c] = to_bf16(weight ? xr[c] * inv * weight[c] : xr[c]);
    }
}

/* qkv bfloat16 [n, (hq + 2 hkv) d] -> q float32 [n, hq, d] with RoPE; k (with RoPE) and v into
 * the cache rows start.. start + n - 1. cos, sin: float32 [n, d]. */
void rope_into_cache(const uint16_t *qkv, const float *cos_, const float *sin_, float *q, float *kcache,
                     float *vcache, int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t capacity,
                     int64_t start, int threads) {
    const int64_t width = (hq + 2 * hkv) * d, half = d / 2;
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *row = qkv + r * width;
        const float *cr = cos_ + r * d, *sr = sin_ + r * d;
        for (int64_t h = 0; h < hq + 2 * hkv; h++) {
            float *dst = h < hq ? q + (r * hq + h) * d
                       : h < hq + hkv ? kcache + ((h - hq) * capacity + start + r) * d
                       : vcache + ((h - hq - hkv) * capacity + start + r) * d;
            const uint16_t *src = row + h * d;
            if (h >= hq + hkv) {  /* values: no rotation */
                for (int64_t c = 0; c < d; c++) dst[c] = from_bf16(src[c]);
                continue;
            }
            for (int64_t c = 0; c < half; c++) {
                const float a = from_bf16(src[c]), b = from_bf16(src[c + half]);
                dst[c] = a * cr[c] - b * sr[c];
                dst[c + half] = b * cr[c + half] + a * sr[c + half];
            }
        }
    }
}

/* Attention of q [n, hq, d] over the cache [hkv, capacity, d] (first t rows valid), each
 * (row, head) alone: the row's allowed keys in cache order (a prefix plus the row's ancestors,
 * so the same keys in the same order as when the position is scored alone), fixed-order dot
 * products, softmax in float32 with a running sum in key order, and the weighted sum of values
 * in key order. out: bfloat16 [n, hq * d], the input of the output projection. */
void tree_attention(const float *q, const float *k, const float *v, const uint8_t *allowed, uint16_t *out,
                    int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t capacity, int64_t t,
                    float scale, int threads) {
    const int64_t group = hq / hkv;
#pragma omp parallel num_threads(threads)
    {
        int64_t *keys = malloc(sizeof(int64_t) * (size_t)t);
        float *p = malloc(sizeof(float) * (size_t)t);
        float *acc = malloc(sizeof(float) * (size_t)d);
#pragma omp for schedule(static)
        for (int64_t item = 0; item < n * hkv; item++) {
            const int64_t row = item / hkv, g = item % hkv;
            int64_t m = 0;
            for (int64_t j = 0; j < t; j++)
                if (allowed[row * t + j]) keys[m++] = j;
            const float *kg = k + g * capacity * d, *vg = v + g * capacity * d;
            for (int64_t h = g * group; h < (g + 1) * group; h++) {
                const float *qh = q + (row * hq + h) * d;
                float top = -INFINITY, total = 0.0f;
                for (int64_t j = 0; j < m; j++) {
                    p[j] = dot(qh, kg + keys[j] * d, d) * scale;
                    top = p[j] > top ? p[j] : top;
                }
                for (int64_t c = 0; c < d; c++) acc[c] = 0.0f;
                for (int64_t j = 0; j < m; j++) {
                    const float w = expf(p[j] - top);
                    const float *vj = vg + keys[j] * d;
                    total += w;
                    for (int64_t c = 0; c < d; c++) acc[c] += w * vj[c];
                }
                uint16_t *o = out + (row * hq + h) * d;
                for (int64_t c = 0; c < d; c++) o[c] = to_bf16(acc[c] / total);
            }
        }
        free(keys);
        free(p);
        free(acc);
    }
}

/* gate_up bfloat16 [n, 2 i] (gate, then up) -> silu(gate) * up in bfloat16 [n, i] */
void swiglu(const uint16_t *gate_up, uint16_t *out, int64_t n, int64_t inner, int threads) {
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < inner; c++) {
            const float g = from_bf16(gate_up[r * 2 * inner + c]), u = from_bf16(gate_up[r * 2 * inner + inner + c]);
            out[r * inner + c] = to_bf16(g / (1.0f + expf(-g)) * u);
        }
}
