/* The exact engine's per-row operations (lab/target/exact.py): everything in a decoder layer except
 * its four bfloat16 products, which oneDNN computes where it has bfloat16 kernels and linear_bf16
 * (at the end of this file) computes elsewhere.
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
 * per layer the cache holds keys transposed, float32 [kv_heads, head_dim, capacity] (so LANES
 * consecutive keys are one vector), and values as float32 [kv_heads, capacity, head_dim]. head_dim and hidden must
 * be multiples of 16 (checked in Python).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A vector's lanes: 16 floats with AVX-512, 8 with AVX2 (whose 16 registers would otherwise hold
 * each 16-lane value in two, spilling the partial sums to memory: 4x slower attention). Each
 * machine computes with its own width, the same for every call, so a row's bits never depend on
 * the rows that come with it; two machines' bits may differ, as their products do. */
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif

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

/* LANES floats (or ints) as one value: GCC's vector extensions, so that the kernel's lanes are
 * explicit (AVX-512 or AVX2 with -march=native) and its order of operations is fixed by the source */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static inline vf loadv(const float *src) {
    vf v;
    memcpy(&v, src, sizeof v);
    return v;
}

typedef uint16_t vbf __attribute__((vector_size(2 * LANES)));
typedef uint32_t vu __attribute__((vector_size(4 * LANES)));

/* LANES bfloat16 values widened to float32, and LANES float32 values rounded to bfloat16: the same
 * bits as from_bf16 and to_bf16 lane by lane, in a few vector instructions */
static inline vf load_bf16v(const uint16_t *src) {
    vbf h;
    memcpy(&h, src, sizeof h);
    const vu u = __builtin_convertvector(h, vu) << 16;
    vf f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void store_bf16v(uint16_t *dst, vf f) {
    vu u;
    memcpy(&u, &f, sizeof u);
    const vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);  /* all ones where NaN */
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vbf h = __builtin_convertvector((rounded & ~nan) | (((u >> 16) | 0x40u) & nan), vbf);
    memcpy(dst, &h, sizeof h);
}

/* a fixed-order sum of a[c] * b[c]: LANES lanes, then the lanes folded in halves */
static float dot(const float *a, const float *b, int64_t d) {
    float lane[LANES] = {0};
    for (int64_t c = 0; c < d; c += LANES)
        for (int l = 0; l < LANES; l++) lane[l] += a[c + l] * b[c + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* x += delta (if given); out = RMSNorm(x) * weight in bfloat16 (out = x if weight is NULL:
 * a model whose final norm is the identity); hidden is a multiple of 16 (checked in Python) */
void add_norm(float *x, const uint16_t *delta, const float *weight, float eps, uint16_t *out,
              int64_t n, int64_t hidden, int threads) {
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        float *xr = x + r * hidden;
        if (delta)
            for (int64_t c = 0; c < hidden; c += LANES) {
                const vf sum = loadv(xr + c) + load_bf16v(delta + r * hidden + c);
                memcpy(xr + c, &sum, sizeof sum);
            }
        float inv = 1.0f;
        if (weight) inv = 1.0f / sqrtf(dot(xr, xr, hidden) / (float)hidden + eps);
        for (int64_t c = 0; c < hidden; c += LANES)
            store_bf16v(out + r * hidden + c, weight ? loadv(xr + c) * inv * loadv(weight + c) : loadv(xr + c));
    }
}

/* qkv bfloat16 [n, (hq + 2 hkv) d] -> q float32 [n, hq, d] with RoPE; k (with RoPE) and v into
 * the cache at positions start.. start + n - 1. cos, sin: float32 [n, d]. */
void rope_into_cache(const uint16_t *qkv, const float *cos_, const float *sin_, float *q, float *kcache,
                     float *vcache, int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t capacity,
                     int64_t start, int threads) {
    const int64_t width = (hq + 2 * hkv) * d, half = d / 2;
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *row = qkv + r * width;
        const float *cr = cos_ + r * d, *sr = sin_ + r * d;
        for (int64_t h = 0; h < hq + 2 * hkv; h++) {
            const uint16_t *src = row + h * d;
            if (h >= hq + hkv) {  /* values: no rotation */
                float *dst = vcache + ((h - hq - hkv) * capacity + start + r) * d;
                for (int64_t c = 0; c < d; c++) dst[c] = from_bf16(src[c]);
                continue;
            }
            /* queries row-major; keys transposed, channel c of position p at c * capacity + p */
            float *dst = h < hq ? q + (r * hq + h) * d : kcache + (h - hq) * d * capacity + start + r;
            const int64_t step = h < hq ? 1 : capacity;
            for (int64_t c = 0; c < half; c++) {
                const float a = from_bf16(src[c]), b = from_bf16(src[c + half]);
                dst[c * step] = a * cr[c] - b * sr[c];
                dst[(c + half) * step] = b * cr[c + half] + a * sr[c + half];
            }
        }
    }
}

/* exp of LANES values x <= 0 (Cephes' expf: Cody-Waite reduction, degree-6 polynomial, about
 * 1 ulp; below -87 the result is flushed to 2^-126, a weight of nothing) */
static inline vf expv(vf x) {
    const vf low = x - x - 87.0f, magic = x - x + 12582912.0f;  /* 1.5 * 2^23 rounds to an integer */
    const vi below = x < low;  /* all ones where x < -87: take -87 there */
    vi xi, li;
    memcpy(&xi, &x, sizeof xi);
    memcpy(&li, &low, sizeof li);
    xi = (xi & ~below) | (li & below);
    memcpy(&x, &xi, sizeof x);
    const vf n = (x * 1.44269504088896341f + magic) - magic;
    const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = r - r + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vf y = p * r * r + r + 1.0f;
    const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return y * two_n;
}

#define MAX_GROUP 8 /* query heads per KV head the attention kernel takes (checked in Python) */

/* The attention below for R (1 or 2) rows of one KV head: row i has keys[i], its m[i] allowed
 * positions, p[i] a scratch of group x padded floats, q[i] its group of queries and o[i] its
 * output; block is a d x LANES scratch. The first `shared` entries (a multiple of LANES) of the rows'
 * key lists are the same positions, so each of their keys and values is loaded once for both
 * rows; every row's arithmetic is exactly what it is alone (R = 1, shared = 0): the same
 * operations on the same values in the same order. Inlined with R and `group` constants (see
 * the switch below), so the partial sums stay in registers. */
static inline __attribute__((always_inline)) void attend_rows(
        const int R, const float *const *q, const float *ktg, const float *vg, int64_t *const *keys,
        const int64_t *m, int64_t shared, int64_t d, int64_t capacity, int64_t padded, float scale,
        const int group, float *const *p, float *block, uint16_t *const *o) {
    /* 2. scores, LANES keys per block, one key per lane; four partial sums per head over the
     *    channels c = 0, 1, 2, 3 mod 4 (independent chains keep the FMA units busy), added in a
     *    fixed order. Blocks before `shared` are scored for all rows at once, later ones row
     *    by row. */
    for (int i = 0; i < R; i++) {
        for (int64_t b = i == 0 ? 0 : shared; b < m[i]; b += LANES) {
            const int rows = b < shared ? R : 1, first = b < shared ? 0 : i;
            const int64_t width = m[i] - b < LANES ? m[i] - b : LANES;
            const int64_t *kb = keys[i] + b;
            const float *src = ktg + kb[0];
            int64_t stride = capacity;
            if (width < LANES || kb[LANES - 1] - kb[0] != LANES - 1) {
                for (int64_t c = 0; c < d; c++)  /* a partial block repeats its first key */
                    for (int l = 0; l < LANES; l++)
                        block[c * LANES + l] = ktg[c * capacity + kb[l < width ? l : 0]];
                src = block;
                stride = LANES;
            }
            vf part[2][MAX_GROUP][4];
            for (int r = 0; r < rows; r++)
                for (int h = 0; h < group; h++)
                    for (int k = 0; k < 4; k++) part[r][h][k] = (vf){0};
            for (int64_t c = 0; c < d; c += 4) {
                const vf k0 = loadv(src + c * stride), k1 = loadv(src + (c + 1) * stride),
                          k2 = loadv(src + (c + 2) * stride), k3 = loadv(src + (c + 3) * stride);
                for (int r = 0; r < rows; r++)
                    for (int h = 0; h < group; h++) {
                        const float *qh = q[first + r] + h * d + c;
                        part[r][h][0] += qh[0] * k0;
                        part[r][h][1] += qh[1] * k1;
                        part[r][h][2] += qh[2] * k2;
                        part[r][h][3] += qh[3] * k3;
                    }
            }
            for (int r = 0; r < rows; r++)
                for (int h = 0; h < group; h++) {
                    const vf score = ((part[r][h][0] + part[r][h][1]) + (part[r][h][2] + part[r][h][3])) * scale;
                    memcpy(p[first + r] + h * padded + b, &score, sizeof score);
                }
        }
    }
    /* 3. softmax: the max (exact in any order), exp, and the sum in 16 fixed lanes (key j in lane j % 16)
     *    folded in halves, whatever LANES is: an AVX2 build (8) adds in the order an AVX-512 one (16) does */
    for (int i = 0; i < R; i++) {
        const int64_t blocks = (m[i] + LANES - 1) / LANES;
        for (int h = 0; h < group; h++) {
            float *ph = p[i] + h * padded;
            vf topv = loadv(ph);
            for (int64_t j = LANES; j + LANES <= m[i]; j += LANES) {
                const vf x = loadv(ph + j);
                for (int l = 0; l < LANES; l++) topv[l] = x[l] > topv[l] ? x[l] : topv[l];
            }
            float top = -INFINITY;
            for (int l = 0; l < LANES && l < m[i]; l++) top = topv[l] > top ? topv[l] : top;
            for (int64_t j = m[i] / LANES * LANES; j < m[i]; j++) top = ph[j] > top ? ph[j] : top;
            float total[16] = {0};
            for (int64_t b = 0; b < blocks; b++) {
                vf e = expv(loadv(ph + b * LANES) - top);
                if (b == blocks - 1)
                    for (int l = (int)(m[i] - b * LANES); l < LANES; l++) e[l] = 0.0f;
                memcpy(ph + b * LANES, &e, sizeof e);
                for (int l = 0; l < LANES; l++) total[(b * LANES + l) % 16] += e[l];
            }
            for (int w = 8; w > 0; w /= 2)
                for (int l = 0; l < w; l++) total[l] += total[l + w];
            const float inv = 1.0f / total[0];
            for (int64_t j = 0; j < blocks * LANES; j++) ph[j] *= inv;
        }
    }
    /* 4. values weighted in key order, LANES channels per lane block; even and odd keys in two
     *    partial sums (again for independent chains), added at the end. The shared keys (an
     *    even count) for all rows at once, then each row goes on from there alone. */
    for (int64_t c = 0; c < d; c += LANES) {
        vf even[2][MAX_GROUP], odd[2][MAX_GROUP];
        for (int r = 0; r < R; r++)
            for (int h = 0; h < group; h++) even[r][h] = odd[r][h] = (vf){0};
        for (int64_t j = 0; j < shared; j += 2) {
            const vf v0 = loadv(vg + keys[0][j] * d + c), v1 = loadv(vg + keys[0][j + 1] * d + c);
            for (int r = 0; r < R; r++)
                for (int h = 0; h < group; h++) {
                    even[r][h] += p[r][h * padded + j] * v0;
                    odd[r][h] += p[r][h * padded + j + 1] * v1;
                }
        }
        for (int r = 0; r < R; r++) {
            const int64_t *kr = keys[r];
            const float *pr = p[r];
            int64_t j = shared;
            for (; j + 1 < m[r]; j += 2) {
                const vf v0 = loadv(vg + kr[j] * d + c), v1 = loadv(vg + kr[j + 1] * d + c);
                for (int h = 0; h < group; h++) {
                    even[r][h] += pr[h * padded + j] * v0;
                    odd[r][h] += pr[h * padded + j + 1] * v1;
                }
            }
            if (j < m[r]) {
                const vf v0 = loadv(vg + kr[j] * d + c);
                for (int h = 0; h < group; h++) even[r][h] += pr[h * padded + j] * v0;
            }
            for (int h = 0; h < group; h++) {
                const vf sum = even[r][h] + odd[r][h];
                for (int l = 0; l < LANES; l++) o[r][h * d + c + l] = to_bf16(sum[l]);
            }
        }
    }
}

/* Attention of q [n, hq, d] over the cache (keys transposed: [hkv, d, capacity]; values
 * [hkv, capacity, d]; the first t positions valid), each (row, KV head) as if alone:
 *   1. the row's allowed keys, gathered in cache order (a prefix plus the row's ancestors, so
 *      the same keys in the same order as when the position is scored alone);
 *   2. scores for LANES keys at a time, one key per lane (keys that are not contiguous in the
 *      cache are first copied into a LANES-wide block, so the arithmetic is the same either way);
 *   3. softmax in float32;
 *   4. the weighted sum of values in key order.
 * Every step depends on the row's own keys only. Rows go in pairs, which share the loads of
 * the keys their lists begin with (a tree's rows all begin with the context): the attention of
 * a tree costs less than its rows one by one, with the same bits. The work items run KV head
 * by KV head, so one core takes all pairs of a head and reads that head's cache from memory
 * once (items in pair order split a head's pairs between the cores: a one-off timing of a
 * 6-node tree after 250 tokens read 2.2 ms against 2.6 ms in pair order).
 * out: bfloat16 [n, hq * d], the input of the output projection. */
void tree_attention(const float *q, const float *kt, const float *v, const uint8_t *allowed, uint16_t *out,
                    int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t capacity, int64_t t,
                    float scale, int threads) {
    const int64_t group = hq / hkv, padded = (t + LANES - 1) / LANES * LANES, pairs = (n + 1) / 2;
#pragma omp parallel num_threads(threads)
    {
        int64_t *keys[2] = {malloc(sizeof(int64_t) * (size_t)padded), malloc(sizeof(int64_t) * (size_t)padded)};
        float *p[2] = {aligned_alloc(64, sizeof(float) * (size_t)(group * padded)),
                       aligned_alloc(64, sizeof(float) * (size_t)(group * padded))};
        float *block = aligned_alloc(64, sizeof(float) * (size_t)(d * LANES));
#pragma omp for schedule(static)
        for (int64_t item = 0; item < pairs * hkv; item++) {
            const int64_t g = item / pairs, pair = item % pairs;
            const int R = 2 * pair + 1 < n ? 2 : 1;
            const float *qs[2];
            uint16_t *os[2];
            int64_t m[2] = {0, 0};
            for (int i = 0; i < R; i++) {
                const int64_t row = 2 * pair + i;
                for (int64_t j = 0; j < t; j++)  /* 1. */
                    if (allowed[row * t + j]) keys[i][m[i]++] = j;
                qs[i] = q + (row * hq + g * group) * d;
                os[i] = out + (row * hq + g * group) * d;
            }
            int64_t shared = 0;
            if (R == 2) {
                const int64_t most = m[0] < m[1] ? m[0] : m[1];
                while (shared < most && keys[0][shared] == keys[1][shared]) shared++;
                shared = shared / LANES * LANES;
            }
            const float *ktg = kt + g * d * capacity, *vg = v + g * capacity * d;
#define ATTEND(R_, G) attend_rows(R_, qs, ktg, vg, keys, m, shared, d, capacity, padded, scale, G, p, block, os)
#define GROUPS(R_) switch (group) { \
                case 1: ATTEND(R_, 1); break; \
                case 2: ATTEND(R_, 2); break; \
                case 3: ATTEND(R_, 3); break; \
                case 4: ATTEND(R_, 4); break; \
                default: ATTEND(R_, MAX_GROUP < group ? MAX_GROUP : (int)group); break; }
            if (R == 2) GROUPS(2) else GROUPS(1)
#undef GROUPS
#undef ATTEND
        }
        free(keys[0]);
        free(keys[1]);
        free(p[0]);
        free(p[1]);
        free(block);
    }
}

/* where mask (all ones) a, else b */
static inline vf selectv(vi mask, vf a, vf b) {
    vi ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    ai = (ai & mask) | (bi & ~mask);
    memcpy(&a, &ai, sizeof a);
    return a;
}

/* silu(g) = g / (1 + exp(-g)) for LANES values, with expv (which takes arguments <= 0):
 * e = exp(-|g|), and g / (1 + e) for g >= 0, g * e / (1 + e) below */
static inline vf siluv(vf g) {
    const vf zero = g - g, one = zero + 1.0f;
    const vi negative = g < zero;
    const vf e = expv(selectv(negative, g, -g));
    return g * (selectv(negative, e, one) / (one + e));
}

/* gate_up bfloat16 [n, 2 i] (gate, then up) -> silu(gate) * up in bfloat16 [n, i]; LANES columns
 * at a time (a partial last block padded with zeros), so a value depends on its own inputs only */
void swiglu(const uint16_t *gate_up, uint16_t *out, int64_t n, int64_t inner, int threads) {
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *gate = gate_up + r * 2 * inner, *up = gate + inner;
        uint16_t *o = out + r * inner;
        int64_t c = 0;
        for (; c + LANES <= inner; c += LANES)
            store_bf16v(o + c, siluv(load_bf16v(gate + c)) * load_bf16v(up + c));
        if (c < inner) {
            vf g = {0}, u = {0};
            for (int64_t l = 0; c + l < inner; l++) {
                g[l] = from_bf16(gate[c + l]);
                u[l] = from_bf16(up[c + l]);
            }
            const vf y = siluv(g) * u;
            for (int64_t l = 0; c + l < inner; l++) o[c + l] = to_bf16(y[l]);
        }
    }
}

/* The products on CPUs where oneDNN has no bfloat16 kernels (lab/target/exact.py): y = x w^T with
 * x bfloat16 [n, in], y bfloat16 [n, out], summed in float32. w comes packed in panels of 16
 * outputs, bfloat16 [ceil(out / 16)][in][16] (outputs past `out` zero), so that one panel is one
 * contiguous stream. Every y[r, j] is one chain of multiply-adds over k in increasing order, from
 * zero, whichever block kernel computes it and however the panels are split between threads, so a
 * row's result never depends on the other rows. The blocks (1 to 6 rows against one panel) only
 * decide how many rows share each weight read: up to 6 rows read a panel once. */
typedef float f8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline f8 load_bf16x8(const uint16_t *src) {
    u16x8 h;
    memcpy(&h, src, sizeof h);
    const u32x8 u = __builtin_convertvector(h, u32x8) << 16;
    f8 f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define PANEL 16
#define MAX_BLOCK_ROWS 6

/* R rows of x (float32, stride in) against one panel; the first `cols` outputs into y (stride out) */
#define PRODUCT_BLOCK(R)                                                                               \
    static void block_##R(const float *x, const uint16_t *panel, uint16_t *y, int64_t in, int64_t out,  \
                          int64_t cols) {                                                              \
        f8 acc[R][2];                                                                                  \
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (f8){0};                                   \
        for (int64_t k = 0; k < in; k++) {                                                             \
            const f8 low = load_bf16x8(panel + k * PANEL), high = load_bf16x8(panel + k * PANEL + 8);  \
            for (int r = 0; r < R; r++) {                                                              \
                const float xr = x[r * in + k];                                                        \
                acc[r][0] += xr * low;                                                                 \
                acc[r][1] += xr * high;                                                                \
            }                                                                                          \
        }                                                                                              \
        for (int r = 0; r < R; r++) {                                                                  \
            float lanes[PANEL];                                                                        \
            memcpy(lanes, acc[r], sizeof lanes);                                                       \
            for (int64_t c = 0; c < cols; c++) y[r * out + c] = to_bf16(lanes[c]);                     \
        }                                                                                              \
    }
PRODUCT_BLOCK(1)
PRODUCT_BLOCK(2)
PRODUCT_BLOCK(3)
PRODUCT_BLOCK(4)
PRODUCT_BLOCK(5)
PRODUCT_BLOCK(6)

typedef void (*product_block)(const float *, const uint16_t *, uint16_t *, int64_t, int64_t, int64_t);
static const product_block BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, block_1, block_2, block_3, block_4, block_5, block_6};

void linear_bf16(const uint16_t *x, const uint16_t *panels, uint16_t *y, int64_t n, int64_t in, int64_t out,
                 int threads) {
    float *xf = malloc((size_t)(n * in) * sizeof *xf);
    for (int64_t i = 0; i < n * in; i++) xf[i] = from_bf16(x[i]);
    const int64_t count = (out + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < count; p++) {
        const int64_t cols = out - p * PANEL < PANEL ? out - p * PANEL : PANEL;
        for (int64_t r = 0; r < n; r += MAX_BLOCK_ROWS) {
            const int64_t rows = n - r < MAX_BLOCK_ROWS ? n - r : MAX_BLOCK_ROWS;
            BLOCKS[rows](xf + r * in, panels + p * PANEL * in, y + r * out + p * PANEL, in, out, cols);
        }
    }
    free(xf);
}
