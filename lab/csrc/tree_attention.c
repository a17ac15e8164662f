/* Attention whose result for a query row does not depend on the other rows.
 *
 * Exact speculative decoding needs the target to compute the same bits for a position whether
 * it is scored alone (AR) or inside a chain or tree. Library matrix products choose their
 * blocking, and so their order of additions, by the shapes of the whole call; this kernel
 * instead computes every (query row, head) on its own, in one fixed order:
 *   1. the row's allowed keys, gathered in cache order (a prefix plus the row's ancestors, so
 *      the same keys in the same order as when the position is scored alone);
 *   2. each score a 64-wide dot product summed in 16 lanes, then the lanes folded in halves;
 *   3. softmax in float32: the max, then exp and a running sum in key order;
 *   4. the weighted sum of values in key order, one lane per channel.
 * Nothing in a row's arithmetic depends on n, on the mask of other rows or on the cache
 * capacity, so the result is invariant by construction (the tests check it bit for bit).
 *
 * q: [n, hq, d]; k, v: [hkv, capacity, d] (the first t rows valid); allowed: [n, t] bytes;
 * out: [n, hq, d]. All float32, contiguous. d must be a multiple of 16.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define LANES 16

static float dot(const float *a, const float *b, int64_t d) {
    float lane[LANES] = {0};
    for (int64_t c = 0; c < d; c += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += a[c + l] * b[c + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

void tree_attention(const float *q, const float *k, const float *v, const uint8_t *allowed, float *out,
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
                float *o = out + (row * hq + h) * d;
                for (int64_t c = 0; c < d; c++) o[c] = acc[c] / total;
            }
        }
        free(keys);
        free(p);
        free(acc);
    }
}
