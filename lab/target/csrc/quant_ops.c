/* The quantised engine's arithmetic (lab/target/quant.py): products on the GGUF's own Q4_1 and Q8_0
 * blocks, and the float32 per-row operations around them.
 *
 * Exactness: a row's output must be the same bits whatever rows share the call, however many threads
 * run it, and in every build of this file (no vector instructions, AVX2, AVX-512). So:
 *   - activations are quantised per row and per 32-block (the row's own block only): q = rint(x * 127 /
 *     amax), scale amax / 127, and (for Q4_1's offset term) the block's scale times the sum of its q;
 *   - each block's integer dot product is exact, so any instruction sequence (VNNI, AVX2's
 *     maddubs/madd, plain C) gives the same integer;
 *   - each output's float sum is one chain over the blocks in block order, acc = acc + (dw * dx) * isum
 *     (+ mw * (dx * sum) for Q4_1), with the lanes of a vector holding 16 different outputs, never
 *     one output's partial sums; the build runs with -ffp-contract=off, so no build fuses the chain.
 * A vector is always 16 lanes here (GCC vector extensions, split by the compiler where registers are
 * narrower): lane arithmetic is elementwise, so the width the hardware has never changes a bit.
 *
 * Weight layout ("panels"): 16 outputs x one 32-input block per record, records in block order per
 * panel, panels in output order (outputs past `out` zero).
 *   Q4_1 record, 320 bytes: fp16 d[16], fp16 m[16], then 4 groups j of [16 outputs][4 bytes t], each
 *     byte the GGUF's byte 4j + t of that output's block: input 4j + t in its low nibble, 16 + 4j + t
 *     in its high one (the file's bytes, transposed only).
 *   Q8_0 record, 544 bytes: fp16 d[16], then 8 groups g of [16 outputs][4 bytes t], input 4g + t plus
 *     128 as an unsigned byte (VNNI multiplies unsigned by signed bytes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define LANES 16
#define QK 32
#define MAX_ROWS 4 /* activation rows sharing one pass over a panel */
#define Q4_1_RECORD (LANES * 4 + LANES * QK / 2)
#define Q8_0_RECORD (LANES * 2 + LANES * QK)

typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));
typedef uint32_t vu __attribute__((vector_size(4 * LANES)));
typedef uint16_t vh __attribute__((vector_size(2 * LANES)));

static inline vf loadv(const float *src) {
    vf v;
    memcpy(&v, src, sizeof v);
    return v;
}

static inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 16 fp16 values as float32: exact in every path (F16C, or the exponent rebias by a multiply by
 * 2^112, which also maps fp16 subnormals exactly; scales are finite) */
static inline vf half_to_float(const uint8_t *src) {
    vf f;
#if defined(__AVX512F__)
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
    memcpy(&f, &v, sizeof f);
#elif defined(__F16C__)
    __m128i h[2];
    memcpy(h, src, sizeof h);
    const __m256 lo = _mm256_cvtph_ps(h[0]), hi = _mm256_cvtph_ps(h[1]);
    memcpy(&f, &lo, sizeof lo);
    memcpy((char *)&f + sizeof lo, &hi, sizeof hi);
#else
    vh h;
    memcpy(&h, src, sizeof h);
    const vu u = __builtin_convertvector(h, vu), magnitude = (u & 0x7fffu) << 13;
    memcpy(&f, &magnitude, sizeof f);
    f = f * 0x1p112f;
    vu bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= (u & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
#endif
    return f;
}

/* ---- activations ------------------------------------------------------------------------------ */

typedef struct {
    int8_t *q;     /* [n, in] */
    float *scale;  /* [n, in / QK] */
    float *offset; /* [n, in / QK]: scale * sum of the block's q (Q4_1's m term) */
    int32_t *sum;  /* [n, in / QK]: sum of the block's q (Q8_0's +128 correction) */
} quantised;

/* x float32 (or bfloat16 bits when bf16) [n, in] -> per-block int8, each block on its own */
static quantised quantise(const void *x, int bf16, int64_t n, int64_t in) {
    const int64_t nb = in / QK;
    quantised a = {malloc((size_t)(n * in)), malloc(sizeof(float) * (size_t)(n * nb)),
                   malloc(sizeof(float) * (size_t)(n * nb)), malloc(sizeof(int32_t) * (size_t)(n * nb))};
    for (int64_t i = 0; i < n * nb; i++) {
        float v[QK], amax = 0.0f;
        for (int c = 0; c < QK; c++) {
            v[c] = bf16 ? from_bf16(((const uint16_t *)x)[i * QK + c]) : ((const float *)x)[i * QK + c];
            const float m = fabsf(v[c]);
            amax = m > amax ? m : amax;
        }
        const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int c = 0; c < QK; c++) {
            const int8_t q = (int8_t)rintf(v[c] * inverse);
            a.q[i * QK + c] = q;
            sum += q;
        }
        a.scale[i] = amax / 127.0f;
        a.sum[i] = sum;
        a.offset[i] = a.scale[i] * (float)sum;
    }
    return a;
}

static void release(quantised a) {
    free(a.q);
    free(a.scale);
    free(a.offset);
    free(a.sum);
}

/* ---- exact integer block dot products: isum[r][lane] for R activation rows --------------------- */

static inline int32_t word(const int8_t *x, int g) {
    int32_t w;
    memcpy(&w, x + 4 * g, sizeof w);
    return w;
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
static inline vi from512(__m512i v) {
    vi out;
    memcpy(&out, &v, sizeof out);
    return out;
}
#elif defined(__AVX2__)
static inline vi from256(__m256i lo, __m256i hi) {
    vi out;
    memcpy(&out, &lo, sizeof lo);
    memcpy((char *)&out + sizeof lo, &hi, sizeof hi);
    return out;
}
#endif

/* Q4_1 nibbles (0..15) against R rows' int8 block (x[r] its 32 values) */
static inline __attribute__((always_inline)) void dots_q4(const int R, const uint8_t *qs, const int8_t *const *x,
                                                          vi *isum) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512i lo[4], hi[4];
    for (int j = 0; j < 4; j++) {
        const __m512i w = _mm512_loadu_si512(qs + 64 * j);
        lo[j] = _mm512_and_si512(w, mask);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
    }
    for (int r = 0; r < R; r++) {
        __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            a = _mm512_dpbusd_epi32(a, lo[j], _mm512_set1_epi32(word(x[r], j)));
            b = _mm512_dpbusd_epi32(b, hi[j], _mm512_set1_epi32(word(x[r], 4 + j)));
        }
        isum[r] = from512(_mm512_add_epi32(a, b));
    }
#elif defined(__AVX2__)
    /* maddubs adds two unsigned x signed byte products into 16 bits (at most 2 * 15 * 127, and the
     * low and high nibbles' sums together 4 * 15 * 127: no saturation), madd with ones four into 32 */
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256i acc[MAX_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++)
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 64 * j + 32 * h));
            const __m256i lo = _mm256_and_si256(w, mask), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
            for (int r = 0; r < R; r++) {
                const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(word(x[r], j))),
                                                       _mm256_maddubs_epi16(hi, _mm256_set1_epi32(word(x[r], 4 + j))));
                acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pairs, ones));
            }
        }
    for (int r = 0; r < R; r++) isum[r] = from256(acc[r][0], acc[r][1]);
#else
    for (int r = 0; r < R; r++) {
        int32_t s[LANES] = {0};
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < LANES; l++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t byte = qs[64 * j + 4 * l + t];
                    s[l] += (byte & 15) * x[r][4 * j + t] + (byte >> 4) * x[r][16 + 4 * j + t];
                }
        memcpy(&isum[r], s, sizeof s);
    }
#endif
}

/* Q8_0 bytes (weight + 128) against R rows' int8 block; the +128 is taken out with the block sums */
static inline __attribute__((always_inline)) void dots_q8(const int R, const uint8_t *qs, const int8_t *const *x,
                                                          const int32_t *sums, vi *isum) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    __m512i a[MAX_ROWS], b[MAX_ROWS];
    for (int r = 0; r < R; r++) a[r] = b[r] = _mm512_setzero_si512();
    for (int g = 0; g < 8; g += 2) {
        const __m512i w0 = _mm512_loadu_si512(qs + 64 * g), w1 = _mm512_loadu_si512(qs + 64 * (g + 1));
        for (int r = 0; r < R; r++) {
            a[r] = _mm512_dpbusd_epi32(a[r], w0, _mm512_set1_epi32(word(x[r], g)));
            b[r] = _mm512_dpbusd_epi32(b[r], w1, _mm512_set1_epi32(word(x[r], g + 1)));
        }
    }
    for (int r = 0; r < R; r++) isum[r] = from512(_mm512_add_epi32(a[r], b[r])) - 128 * sums[r];
    (void)sums;
#elif defined(__AVX2__)
    /* signed weights back (byte ^ 0x80), then maddubs(|w|, x * sign(w)): at most 2 * 128 * 127 */
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i acc[MAX_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++)
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32 * h)), flip);
            const __m256i magnitude = _mm256_sign_epi8(w, w);
            for (int r = 0; r < R; r++) {
                const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(word(x[r], g)), w);
                acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x),
                                                                          ones));
            }
        }
    for (int r = 0; r < R; r++) isum[r] = from256(acc[r][0], acc[r][1]);
    (void)sums;
#else
    for (int r = 0; r < R; r++) {
        int32_t s[LANES] = {0};
        for (int g = 0; g < 8; g++)
            for (int l = 0; l < LANES; l++)
                for (int t = 0; t < 4; t++) s[l] += ((int32_t)qs[64 * g + 4 * l + t] - 128) * x[r][4 * g + t];
        memcpy(&isum[r], s, sizeof s);
    }
    (void)sums;
#endif
}

/* ---- products ----------------------------------------------------------------------------------- */

/* R rows (from `first`) against one panel of either type: each lane's chain over the blocks in order */
static inline __attribute__((always_inline)) void panel_rows(const int R, const int q4, const uint8_t *panel,
                                                             const quantised *a, int64_t first, int64_t in,
                                                             float *y, int64_t out, int64_t cols) {
    const int64_t nb = in / QK;
    vf acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = (vf){0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *record = panel + b * (q4 ? Q4_1_RECORD : Q8_0_RECORD);
        const int8_t *x[MAX_ROWS];
        int32_t sums[MAX_ROWS];
        for (int r = 0; r < R; r++) {
            x[r] = a->q + (first + r) * in + b * QK;
            sums[r] = a->sum[(first + r) * nb + b];
        }
        const vf dw = half_to_float(record);
        vi isum[MAX_ROWS];
        if (q4) {
            const vf mw = half_to_float(record + 2 * LANES);
            dots_q4(R, record + 4 * LANES, x, isum);
            for (int r = 0; r < R; r++) {
                const int64_t i = (first + r) * nb + b;
                acc[r] = acc[r] + (dw * a->scale[i]) * __builtin_convertvector(isum[r], vf) + mw * a->offset[i];
            }
        } else {
            dots_q8(R, record + 2 * LANES, x, sums, isum);
            for (int r = 0; r < R; r++)
                acc[r] = acc[r] + (dw * a->scale[(first + r) * nb + b]) * __builtin_convertvector(isum[r], vf);
        }
    }
    for (int r = 0; r < R; r++) {
        float lanes[LANES];
        memcpy(lanes, &acc[r], sizeof lanes);
        memcpy(y + (first + r) * out, lanes, sizeof(float) * (size_t)cols);
    }
}

static void linear(const void *x, int bf16, const uint8_t *w, float *y, int64_t n, int64_t in, int64_t out,
                   int threads, int q4) {
    const quantised a = quantise(x, bf16, n, in);
    const int64_t panels = (out + LANES - 1) / LANES, bytes = in / QK * (q4 ? Q4_1_RECORD : Q8_0_RECORD);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        const int64_t cols = out - p * LANES < LANES ? out - p * LANES : LANES;
        const uint8_t *panel = w + p * bytes;
        float *yp = y + p * LANES;
        for (int64_t r = 0; r < n; r += MAX_ROWS) {
            const int64_t left = n - r;
#define ROWS(R_) (q4 ? panel_rows(R_, 1, panel, &a, r, in, yp, out, cols) \
                     : panel_rows(R_, 0, panel, &a, r, in, yp, out, cols))
            if (left >= 4) ROWS(4);
            else if (left == 3) ROWS(3);
            else if (left == 2) ROWS(2);
            else ROWS(1);
#undef ROWS
        }
    }
    release(a);
}

/* y float32 [n, out] = x [n, in] (float32, or bfloat16 bits if bf16) times a packed Q4_1 weight^T */
void linear_q4_1(const void *x, int bf16, const uint8_t *w, float *y, int64_t n, int64_t in, int64_t out,
                 int threads) {
    linear(x, bf16, w, y, n, in, out, threads, 1);
}

/* the same for a packed Q8_0 weight */
void linear_q8_0(const void *x, int bf16, const uint8_t *w, float *y, int64_t n, int64_t in, int64_t out,
                 int threads) {
    linear(x, bf16, w, y, n, in, out, threads, 0);
}

/* rows `ids` of a packed Q8_0 weight [out, in] as float32 (d * q is exact in float32): the embedding */
void embed_q8_0(const uint8_t *w, const int64_t *ids, float *y, int64_t n, int64_t in) {
    const int64_t nb = in / QK;
    for (int64_t r = 0; r < n; r++) {
        const int64_t p = ids[r] / LANES, l = ids[r] % LANES;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *record = w + (p * nb + b) * Q8_0_RECORD;
            float d[LANES];
            const vf dv = half_to_float(record);
            memcpy(d, &dv, sizeof d);
            for (int c = 0; c < QK; c++)
                y[r * in + b * QK + c] = d[l] * (float)((int32_t)record[2 * LANES + 64 * (c / 4) + 4 * l + c % 4] - 128);
        }
    }
}

/* ---- the float32 per-row operations (as exact_ops.c's, on float32 products) ---------------------- */

/* a fixed-order sum of squares: 16 lanes, folded in halves */
static float sum_squares(const float *a, int64_t d) {
    vf lanes = {0};
    for (int64_t c = 0; c < d; c += LANES) lanes = lanes + loadv(a + c) * loadv(a + c);
    float l[LANES];
    memcpy(l, &lanes, sizeof l);
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}

/* x += delta (if given); out = RMSNorm(x) * weight (out = x if weight is NULL); hidden % 16 == 0 */
void add_norm(float *x, const float *delta, const float *weight, float eps, float *out, int64_t n, int64_t hidden,
              int threads) {
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        float *xr = x + r * hidden;
        if (delta)
            for (int64_t c = 0; c < hidden; c++) xr[c] += delta[r * hidden + c];
        const float inv = weight ? 1.0f / sqrtf(sum_squares(xr, hidden) / (float)hidden + eps) : 1.0f;
        for (int64_t c = 0; c < hidden; c++) out[r * hidden + c] = weight ? xr[c] * inv * weight[c] : xr[c];
    }
}

/* qkv float32 [n, (hq + 2 hkv) d] -> q [n, hq, d] with RoPE, k (with RoPE) and v into the cache (keys
 * [hkv, d, capacity], values [hkv, capacity, d]) at start..; cos, sin [n, d] (the half-split pairing) */
void rope_into_cache(const float *qkv, const float *cos_, const float *sin_, float *q, float *kcache, float *vcache,
                     int64_t n, int64_t hq, int64_t hkv, int64_t d, int64_t capacity, int64_t start, int threads) {
    const int64_t width = (hq + 2 * hkv) * d, half = d / 2;
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        const float *cr = cos_ + r * d, *sr = sin_ + r * d;
        for (int64_t h = 0; h < hq + 2 * hkv; h++) {
            const float *src = qkv + r * width + h * d;
            if (h >= hq + hkv) {
                memcpy(vcache + ((h - hq - hkv) * capacity + start + r) * d, src, sizeof(float) * (size_t)d);
                continue;
            }
            float *dst = h < hq ? q + (r * hq + h) * d : kcache + (h - hq) * d * capacity + start + r;
            const int64_t step = h < hq ? 1 : capacity;
            for (int64_t c = 0; c < half; c++) {
                dst[c * step] = src[c] * cr[c] - src[c + half] * sr[c];
                dst[(c + half) * step] = src[c + half] * cr[c + half] + src[c] * sr[c + half];
            }
        }
    }
}

/* where mask (all ones) a, else b, bit by bit */
static inline vf pick(vi mask, vf a, vf b) {
    vi ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    ai = (ai & mask) | (bi & ~mask);
    memcpy(&a, &ai, sizeof a);
    return a;
}

/* exp(x) for x <= 0, 16 lanes: x = n ln 2 + r (two-part ln 2), e^r by its degree-7 Taylor polynomial
 * (|r| <= ln 2 / 2), times 2^n built in the exponent bits; below -87 the result is taken at -87 */
static inline vf expv(vf x) {
    const vf zero = x - x, floor_ = zero - 87.0f;
    x = pick(x < floor_, floor_, x);
    const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const vf r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    vf p = zero + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* silu(g) * u = g / (1 + e^-g) * u, with e = e^-|g|: g / (1 + e) for g >= 0, g e / (1 + e) below */
static inline vf silu_times(vf g, vf u) {
    const vi negative = g < (g - g);
    const vf e = expv(pick(negative, g, -g));
    return pick(negative, g * e, g) / (1.0f + e) * u;
}

/* gate_up float32 [n, 2 inner] (gate, then up) -> silu(gate) * up [n, inner], 16 columns at a time (a last
 * partial block padded with zeros), so a value depends on its own inputs only */
void swiglu(const float *gate_up, float *out, int64_t n, int64_t inner, int threads) {
#pragma omp parallel for num_threads(threads) if (n > 4)
    for (int64_t r = 0; r < n; r++) {
        const float *gate = gate_up + r * 2 * inner, *up = gate + inner;
        int64_t c = 0;
        for (; c + LANES <= inner; c += LANES) {
            const vf y = silu_times(loadv(gate + c), loadv(up + c));
            memcpy(out + r * inner + c, &y, sizeof y);
        }
        if (c < inner) {
            vf g = {0}, u = {0};
            memcpy(&g, gate + c, sizeof(float) * (size_t)(inner - c));
            memcpy(&u, up + c, sizeof(float) * (size_t)(inner - c));
            const vf y = silu_times(g, u);
            memcpy(out + r * inner + c, &y, sizeof(float) * (size_t)(inner - c));
        }
    }
}
