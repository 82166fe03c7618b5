/* Paged attention on the CPU, one query row at a time, reading K and V where they lie in the cache.
 *
 * Why: the torch path gathers every request's K/V blocks into a contiguous copy per layer and step,
 * converts K to float32, and pays a dozen small torch calls per chunk (RESULTS.md issue 24). Here a
 * query row walks its own block table: each K and V row is read once, in place, converted to float32
 * in registers, and shared by the query heads of its group (GQA).
 *
 * A row's arithmetic depends only on that row: its query, its context length and the K/V it reads.
 * Which other rows share the step, how a prompt was cut into chunks, and how many threads run never
 * change a bit of it, so the same kernel serves the batch-invariant mode too.
 *
 * float32 throughout: scores, softmax (a fixed polynomial exp, the same code for every row) and the
 * weighted sum of V; the output is rounded once into the query's dtype (bf16: round to nearest even).
 * Built at first use by kernels/native_build.py with the host's C compiler (-O3 -march=native -fopenmp);
 * OpenMP binds to the libgomp torch has loaded (same soname), so both share one thread pool.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

/* Lanes of a vector: 16 with AVX-512; 8 elsewhere (AVX2), where a 16-lane vector is two 256-bit halves
 * and the 16-token reduction's shuffles cross them (that build ran 0.5x the torch path at batch-64
 * decodes, RESULTS.md issue 24, "Sixteenth round"). A row's bits are the same whatever tile it is in, for
 * either width; the two widths sum in different orders. */
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
#define DTYPE_F32 0
#define DTYPE_BF16 1

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* exp(x) for x <= 0 (scores minus their maximum): Cephes' range reduction and polynomial, no branches,
 * so the compiler vectorises it; about 2 ulp. Below -87 it returns exp(-87) ~ 1.6e-38, not 0. */
static inline float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = __builtin_fmaf(n, -0.693359375f, x);
    r = __builtin_fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = __builtin_fmaf(p, r, 1.3981999507e-3f);
    p = __builtin_fmaf(p, r, 8.3334519073e-3f);
    p = __builtin_fmaf(p, r, 4.1665795894e-2f);
    p = __builtin_fmaf(p, r, 1.6666665459e-1f);
    p = __builtin_fmaf(p, r, 5.0000001201e-1f);
    p = __builtin_fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}

/* The sum of LANES lanes in a fixed tree, halves paired (the same order for every row). */
static inline float reduce_lanes(const float *l) {
    float t[LANES];
    memcpy(t, l, sizeof t);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) t[i] = t[i] + t[i + w];
    return t[0];
}

typedef float v16 __attribute__((vector_size(LANES * 4))); /* LANES float32 lanes (16 with AVX-512) */
typedef uint32_t u16v __attribute__((vector_size(LANES * 4)));
typedef uint16_t h16v __attribute__((vector_size(LANES * 2)));

/* a * b + c, rounded once where the CPU fuses it. Spelled out because the compiler may fuse either
 * product of ``x * y + z * w`` once a loop is unrolled, which would change a row's bits between builds. */
static inline v16 fma16(v16 a, v16 b, v16 c) {
#if LANES == 16
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return (v16)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

static inline v16 splat(float f) { return (v16){0} + f; }

/* PF_SCALAR_EXP: the scalar loop (a test builds both and compares bits) */
#if !defined(PF_SCALAR_EXP) && (LANES == 16 || (defined(__AVX2__) && defined(__FMA__)))
#define VECTOR_EXP 1
/* ``exp_nonpos`` on LANES scores at once: the same operations in the same order, so each lane's bits are
 * the scalar function's (the scalar loop left the softmax a tenth of a decode's attention). */
static inline v16 exp_nonpos16(v16 x) {
#if LANES == 16
    x = (v16)_mm512_max_ps((__m512)splat(-87.0f), (__m512)x); /* NaN stays NaN, as in the scalar clamp */
    v16 n = (v16)_mm512_roundscale_ps((__m512)(x * 1.44269504088896341f), _MM_FROUND_CUR_DIRECTION);
#else
    x = (v16)_mm256_max_ps((__m256)splat(-87.0f), (__m256)x);
    v16 n = (v16)_mm256_round_ps((__m256)(x * 1.44269504088896341f), _MM_FROUND_CUR_DIRECTION);
#endif
    v16 r = fma16(n, splat(-0.693359375f), x);
    r = fma16(n, splat(2.12194440e-4f), r);
    v16 p = splat(1.9875691500e-4f);
    p = fma16(p, r, splat(1.3981999507e-3f));
    p = fma16(p, r, splat(8.3334519073e-3f));
    p = fma16(p, r, splat(4.1665795894e-2f));
    p = fma16(p, r, splat(1.6666665459e-1f));
    p = fma16(p, r, splat(5.0000001201e-1f));
    p = fma16(p, r * r, r) + 1.0f;
#if LANES == 16
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32((__m512)n), _mm512_set1_epi32(127)), 23);
    return p * (v16)_mm512_castsi512_ps(e);
#else
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32((__m256)n), _mm256_set1_epi32(127)), 23);
    return p * (v16)_mm256_castsi256_ps(e);
#endif
}
#endif

/* LANES consecutive values of a float32 or bf16 row as float32 lanes. */
static inline v16 load16(const void *src, int dtype) {
    v16 r;
    if (dtype == DTYPE_BF16) {
        h16v h;
        memcpy(&h, src, sizeof h);
        u16v u = __builtin_convertvector(h, u16v) << 16;
        memcpy(&r, &u, sizeof r);
    } else {
        memcpy(&r, src, sizeof r);
    }
    return r;
}

#if LANES == 16
/* Lane i of the result is the sum of the 16 lanes of v[i], in a fixed tree: four rounds of pairing
 * halves (the same order for every row, and no horizontal add per token). */
static inline v16 sum_lanes16(const v16 *v) {
    v16 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#else
/* The same for 8 lanes: three rounds of pairing halves. */
static inline v16 sum_lanes16(const v16 *v) {
    v16 a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int i = 0; i < 2; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(b[0], b[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(b[0], b[1], 1, 3, 5, 7, 9, 11, 13, 15);
}
#endif

typedef struct {
    const void *k_cache, *v_cache;
    int kv_dtype, block_size, num_kv_heads, head_dim, group;
    int64_t num_blocks, token_stride; /* elements between consecutive tokens of a block (Hkv * D) */
    int block_shift;                  /* log2(block_size) when a power of two, else -1 */
} Cache;

/* Token t's slot in the cache (block id x block size + offset): a shift and a mask for the usual
 * power-of-two block sizes, since an integer division per token and head cost more than its arithmetic. */
static inline int64_t token_slot(const Cache *c, const int32_t *table, int t) {
    if (c->block_shift >= 0)
        return ((int64_t)table[t >> c->block_shift] << c->block_shift) + (t & (c->block_size - 1));
    return (int64_t)table[t / c->block_size] * c->block_size + t % c->block_size;
}

#define MAX_CHUNKS (256 / LANES) /* head_dim up to 256 */

#define PREFETCH_AHEAD 32 /* V rows ahead of the weighted sum */
#define K_AHEAD 32        /* K rows ahead of the scores' tile */

/* Ask for token t's row (every KV head: the first head's pass brings the others' into cache) early: the
 * step's K/V lies beyond the last-level cache (30 layers), and waiting for each row cost more than the
 * arithmetic (64 decodes over 1,024 tokens: 12.3 -> 7.7 ms). */
static inline void prefetch_row(const Cache *c, const void *cache, const int32_t *table, int t, size_t row_bytes) {
    const char *row = (const char *)cache + (size_t)token_slot(c, table, t) * row_bytes;
    for (size_t at = 0; at < row_bytes; at += 64) __builtin_prefetch(row + at);
}

#define TILE_ROWS 4 /* consecutive query rows of one request that share each K/V row's conversion */

/* A tile of ``rows`` consecutive query rows of one request, row i over the first ``ctx + i`` tokens of
 * ``table``, every KV head. Per head h: ``q + h * qh`` holds rows x group x C vectors (C = D / LANES),
 * already scaled; ``scores + h * sh`` rows x group x ``stride`` floats; ``acc + h * qh`` the result,
 * ``sum`` the softmax denominators. Tokens go in tiles of LANES: each K row is converted once and
 * multiplied by every query head of its group in every row, and LANES tokens' partial sums are reduced
 * together (``sum_lanes16``). The heads take turns over spans of SPAN tokens, so a span's K and V rows
 * come from memory once (the first head's pass asks for every head's part of a row) and from L1 for
 * the others. Every row's own arithmetic (its dot products, softmax and weighted sum, in token order)
 * is the same whichever tile or span it is in, so a decode row alone and the same row inside a prefill
 * tile give the same bits. */
/* tokens per turn of the heads: one tile (against a head's whole pass at a time, 1.0-1.3x per call, most at
 * 1,024-token contexts; spans of 32-256 tokens lost some of it: RESULTS.md issue 24, "Seventeenth round") */
#define SPAN LANES

static inline __attribute__((always_inline)) void scores_span(const Cache *c, const int32_t *table, int ctx, int rows,
                                                            int h, const v16 *q, float *restrict scores,
                                                            size_t stride, int t_begin, int t_end, const int C) {
    const int G = c->group, last = ctx + rows - 1;
    const size_t esize = c->kv_dtype == DTYPE_BF16 ? 2 : 4;
    const size_t row_bytes = (size_t)c->token_stride * esize, head_off = (size_t)h * c->head_dim * esize;
    for (int t0 = t_begin; t0 < t_end; t0 += LANES) {
        v16 k[LANES][MAX_CHUNKS];
        int n = last - t0 < LANES ? last - t0 : LANES;
        for (int i = 0; i < LANES; i++) {
            if (i >= n) {
                for (int j = 0; j < C; j++) k[i][j] = (v16){0};
                continue;
            }
            const char *row = (const char *)c->k_cache + (size_t)token_slot(c, table, t0 + i) * row_bytes + head_off;
            for (int j = 0; j < C; j++) k[i][j] = load16(row + (size_t)j * LANES * esize, c->kv_dtype);
        }
        for (int i = 0; h == 0 && i < LANES && t0 + K_AHEAD + i < last; i++) /* a later tile's rows */
            prefetch_row(c, c->k_cache, table, t0 + K_AHEAD + i, row_bytes);
        for (int r = 0; r < rows; r++) {
            if (t0 >= ctx + r) continue;
            for (int g = 0; g < G; g++) {
                v16 part[LANES];
                const v16 *qg = q + ((size_t)r * G + g) * C;
                /* chunk by chunk over the tile's tokens: LANES independent chains (a token's own sum still
                 * runs over its chunks in order, so its bits are those of one chain per token) */
                for (int i = 0; i < LANES; i++) part[i] = qg[0] * k[i][0];
                for (int j = 1; j < C; j++) {
                    const v16 qj = qg[j];
                    for (int i = 0; i < LANES; i++) part[i] = fma16(qj, k[i][j], part[i]);
                }
                v16 sv = sum_lanes16(part);
                memcpy(scores + ((size_t)r * G + g) * stride + t0, &sv, sizeof sv);
            }
        }
    }
}

/* Scores to softmax weights in place (the first ``ctx + r`` of row r's), their sums in ``sum``. */
static inline void softmax_rows(float *restrict scores, size_t stride, int ctx, int rows, int G, float *sum) {
    for (int rg = 0; rg < rows * G; rg++) {
        const int len = ctx + rg / G;
        float *s = scores + (size_t)rg * stride, lanes[LANES], m = -3.4e38f;
        for (int j = 0; j < LANES; j++) lanes[j] = -3.4e38f;
        int t = 0;
        for (; t + LANES <= len; t += LANES)
            for (int j = 0; j < LANES; j++) lanes[j] = s[t + j] > lanes[j] ? s[t + j] : lanes[j];
        for (int j = 0; t + j < len; j++) lanes[j] = s[t + j] > lanes[j] ? s[t + j] : lanes[j];
        for (int j = 0; j < LANES; j++) m = lanes[j] > m ? lanes[j] : m;
        for (int j = 0; j < LANES; j++) lanes[j] = 0.0f;
#ifdef VECTOR_EXP
        v16 total = (v16){0};
        for (t = 0; t + LANES <= len; t += LANES) {
            v16 e;
            memcpy(&e, s + t, sizeof e);
            e = exp_nonpos16(e - m);
            memcpy(s + t, &e, sizeof e);
            total += e;
        }
        memcpy(lanes, &total, sizeof total);
#else
        for (t = 0; t + LANES <= len; t += LANES)
            for (int j = 0; j < LANES; j++) {
                float e = exp_nonpos(s[t + j] - m);
                s[t + j] = e;
                lanes[j] += e;
            }
#endif
        for (int j = 0; t + j < len; j++) {
            float e = exp_nonpos(s[t + j] - m);
            s[t + j] = e;
            lanes[j] += e;
        }
        sum[rg] = reduce_lanes(lanes);
    }
}

static inline __attribute__((always_inline)) void values_span(const Cache *c, const int32_t *table, int ctx, int rows,
                                                            int h, const float *scores, size_t stride, v16 *acc,
                                                            int t_begin, int t_end, const int C) {
    const int G = c->group, last = ctx + rows - 1;
    const size_t esize = c->kv_dtype == DTYPE_BF16 ? 2 : 4;
    const size_t row_bytes = (size_t)c->token_stride * esize, head_off = (size_t)h * c->head_dim * esize;
    for (int t = t_begin; t < t_end; t++) {
        if (h == 0 && t + PREFETCH_AHEAD < last) prefetch_row(c, c->v_cache, table, t + PREFETCH_AHEAD, row_bytes);
        const char *row = (const char *)c->v_cache + (size_t)token_slot(c, table, t) * row_bytes + head_off;
        v16 v[MAX_CHUNKS];
        for (int j = 0; j < C; j++) v[j] = load16(row + (size_t)j * LANES * esize, c->kv_dtype);
        for (int r = t < ctx ? 0 : t - ctx + 1; r < rows; r++)
            for (int g = 0; g < G; g++) {
                float p = scores[((size_t)r * G + g) * stride + t];
                v16 *a = acc + ((size_t)r * G + g) * C;
                for (int j = 0; j < C; j++) a[j] = fma16((v16){0} + p, v[j], a[j]);
            }
    }
}

static inline __attribute__((always_inline)) int attend_chunks(const Cache *c, const int32_t *table, int ctx, int rows,
                                                             const v16 *q, float *restrict scores, size_t stride,
                                                             v16 *acc, float *sum, const int C) {
    const int G = c->group, H = c->num_kv_heads, last = ctx + rows - 1;
    for (int b = 0; last > 0 && b <= (last - 1) / c->block_size; b++) /* every block the rows read */
        if (table[b] < 0 || table[b] >= c->num_blocks) return -1;
    const size_t esize = c->kv_dtype == DTYPE_BF16 ? 2 : 4, row_bytes = (size_t)c->token_stride * esize;
    const size_t qh = (size_t)rows * G * C, sh = (size_t)rows * G * stride;
    for (int t = 0; t < K_AHEAD && t < last; t++) prefetch_row(c, c->k_cache, table, t, row_bytes);
    for (int t0 = 0; t0 < last; t0 += SPAN) {
        const int t1 = t0 + SPAN < last ? t0 + SPAN : last;
        for (int h = 0; h < H; h++) scores_span(c, table, ctx, rows, h, q + h * qh, scores + h * sh, stride, t0, t1, C);
    }
    for (int t = 0; t < PREFETCH_AHEAD && t < last; t++) prefetch_row(c, c->v_cache, table, t, row_bytes);
    for (int h = 0; h < H; h++) softmax_rows(scores + h * sh, stride, ctx, rows, G, sum + (size_t)h * rows * G);
    for (size_t i = 0; i < (size_t)H * qh; i++) acc[i] = (v16){0};
    for (int t0 = 0; t0 < last; t0 += SPAN) {
        const int t1 = t0 + SPAN < last ? t0 + SPAN : last;
        for (int h = 0; h < H; h++) values_span(c, table, ctx, rows, h, scores + h * sh, stride, acc + h * qh, t0, t1, C);
    }
    for (int i = 0; i < H * rows * G; i++) {
        float inv = 1.0f / sum[i];
        for (int j = 0; j < C; j++) acc[(size_t)i * C + j] *= inv;
    }
    return 0;
}

/* ``attend_chunks`` with the usual chunk counts as constants (head dims 64 and 128), so that its loops over
 * a row's chunks unroll and their vectors stay in registers; the same arithmetic in the same order. */
static int attend(const Cache *c, const int32_t *table, int ctx, int rows, const v16 *q, float *restrict scores,
                  size_t stride, v16 *acc, float *sum) {
    switch (c->head_dim / LANES) {
#ifndef PF_GENERIC_CHUNKS /* a test builds without the constants and compares bits */
    case 4: return attend_chunks(c, table, ctx, rows, q, scores, stride, acc, sum, 4);
    case 8: return attend_chunks(c, table, ctx, rows, q, scores, stride, acc, sum, 8);
    case 16: return attend_chunks(c, table, ctx, rows, q, scores, stride, acc, sum, 16);
#endif
    default: return attend_chunks(c, table, ctx, rows, q, scores, stride, acc, sum, c->head_dim / LANES);
    }
}

/* What every thread of a step reads: the cache, the queries and outputs, the metadata and the tiles. */
typedef struct {
    const Cache *c;
    const void *q;
    void *out;
    int q_dtype, num_q_heads;
    const int32_t *block_tables;
    int64_t table_stride;
    const int32_t *query_start, *seq_lens, *tiles;
    int64_t num_tiles;
    float scale;
    size_t stride, tile_vecs;
} Step;

/* One tile: every KV head of up to TILE_ROWS rows of one request, results written to ``out``. ``buf``:
 * the scores (TILE_ROWS x Hq x stride floats), then the queries and the results (tile_vecs vectors
 * each, every head) and the sums (TILE_ROWS x Hq floats). */
static int run_tile(const Step *s, int64_t it, char *buf, size_t vec_off) {
    const Cache *c = s->c;
    const int G = c->group, D = c->head_dim, C = D / LANES, H = c->num_kv_heads;
    const size_t qsize = s->q_dtype == DTYPE_BF16 ? 2 : 4;
    const int32_t *tile = s->tiles + 3 * it;
    const int first = tile[0], b = tile[1], rows = tile[2];
    const int ctx = s->seq_lens[b] - (s->query_start[b + 1] - first) + 1;
    const size_t qh = (size_t)rows * G * C;
    float *scores = (float *)buf;
    v16 *qv = (v16 *)(buf + vec_off), *acc = qv + s->tile_vecs;
    float *sum = (float *)(acc + s->tile_vecs);
    for (int h = 0; h < H; h++)
        for (int r = 0; r < rows; r++) {
            const char *qr = (const char *)s->q + ((size_t)(first + r) * s->num_q_heads + (size_t)h * G) * D * qsize;
            for (int i = 0; i < G * C; i++)
                qv[h * qh + (size_t)r * G * C + i] = load16(qr + (size_t)i * LANES * qsize, s->q_dtype) * s->scale;
        }
    if (attend(c, s->block_tables + (int64_t)b * s->table_stride, ctx, rows, qv, scores, s->stride, acc, sum))
        return -1;
    for (int h = 0; h < H; h++)
        for (int r = 0; r < rows; r++) {
            char *o = (char *)s->out + ((size_t)(first + r) * s->num_q_heads + (size_t)h * G) * D * qsize;
            const float *res = (const float *)(acc + h * qh + (size_t)r * G * C);
            if (s->q_dtype == DTYPE_BF16) {
                uint16_t *ob = (uint16_t *)o;
                for (int i = 0; i < G * D; i++) ob[i] = f32_to_bf16(res[i]);
            } else {
                memcpy(o, res, (size_t)G * D * sizeof(float));
            }
        }
    return 0;
}

/* The tiles on this thread: with ``shared``, the calling team's share (tiles handed out one at a time),
 * else every tile in order on the calling thread. Returns 0, -1 (a block id outside the cache) or -3. */
static int run_tiles(const Step *s, int shared) {
    const size_t vec_off = ((size_t)TILE_ROWS * s->num_q_heads * s->stride * sizeof(float) + 63) / 64 * 64;
    char *buf = (char *)aligned_alloc(64, vec_off + 2 * s->tile_vecs * sizeof(v16) +
                                              ((size_t)TILE_ROWS * s->num_q_heads * sizeof(float) + 63) / 64 * 64);
    int status = buf ? 0 : -3;
    if (shared) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < s->num_tiles; it++)
            if (!status) status = run_tile(s, it, buf, vec_off);
    } else {
        for (int64_t it = 0; it < s->num_tiles && !status; it++) status = run_tile(s, it, buf, vec_off);
    }
    free(buf);
    return status;
}

/* Varlen causal attention over a paged cache, the contract of kernels/reference.py paged_attention.
 * q, out: [num_tokens, Hq, D] contiguous (dtype q_dtype); caches: [num_blocks, block_size, Hkv, D]
 * contiguous (kv_dtype); block_tables: [num_reqs, table_stride] int32; query_start: [num_reqs + 1]
 * int32; seq_lens: [num_reqs] int32. Request b's queries are the last query_len positions of its
 * seq_lens[b]-token context. Rows of q no request owns are written as zeros.
 * Returns 0, -1 for a block id outside the cache, -2 for inconsistent lengths, -3 out of memory,
 * -4 for a head_dim that is not a multiple of 16 (at most 256). */
int pf_paged_attention(const void *q, void *out, int q_dtype, int64_t num_tokens, int num_q_heads,
                       const void *k_cache, const void *v_cache, int kv_dtype, int64_t num_blocks,
                       int block_size, int num_kv_heads, int head_dim, const int32_t *block_tables,
                       int64_t table_stride, const int32_t *query_start, const int32_t *seq_lens,
                       int num_reqs, float scale, int num_threads) {
    if (num_kv_heads <= 0 || num_q_heads % num_kv_heads || num_q_heads / num_kv_heads > 64) return -2;
    const int G = num_q_heads / num_kv_heads, D = head_dim;
    const size_t qsize = q_dtype == DTYPE_BF16 ? 2 : 4;
    if (D % LANES || D / LANES > MAX_CHUNKS) return -4;
    const int C = D / LANES;
    /* tiles of up to TILE_ROWS consecutive rows of one request: first row, request, rows */
    int64_t max_tiles = num_reqs + num_tokens / TILE_ROWS + 1;
    int32_t *tiles = (int32_t *)malloc((size_t)max_tiles * 3 * sizeof(int32_t));
    char *owned = (char *)calloc((size_t)(num_tokens > 0 ? num_tokens : 1), 1);
    if (!tiles || !owned) {
        free(tiles);
        free(owned);
        return -3;
    }
    int64_t num_tiles = 0;
    int max_ctx = 1;
    for (int b = 0; b < num_reqs; b++) {
        int start = query_start[b], qlen = query_start[b + 1] - start, len = seq_lens[b];
        if (qlen < 0 || qlen > len || start < 0 || start + qlen > num_tokens ||
            (int64_t)(len + block_size - 1) / block_size > table_stride) {
            free(tiles);
            free(owned);
            return -2;
        }
        for (int i = 0; i < qlen; i += TILE_ROWS) {
            int32_t *tile = tiles + 3 * num_tiles++;
            tile[0] = start + i;
            tile[1] = b;
            tile[2] = qlen - i < TILE_ROWS ? qlen - i : TILE_ROWS;
        }
        memset(owned + start, 1, (size_t)qlen);
        max_ctx = len > max_ctx ? len : max_ctx;
    }
    for (int64_t r = 0; r < num_tokens; r++)
        if (!owned[r]) memset((char *)out + (size_t)r * num_q_heads * D * qsize, 0, (size_t)num_q_heads * D * qsize);
    int shift = -1;
    for (int b = 0; b < 31; b++)
        if (block_size == 1 << b) shift = b;
    Cache c = {k_cache, v_cache, kv_dtype, block_size, num_kv_heads, D, G, num_blocks, (int64_t)num_kv_heads * D, shift};
    const size_t stride = (size_t)(max_ctx + LANES - 1) / LANES * LANES;
    const size_t tile_vecs = (size_t)TILE_ROWS * num_q_heads * C; /* every head of a tile */
    Step st = {&c, q, out, q_dtype, num_q_heads, block_tables, table_stride, query_start, seq_lens, tiles,
               num_tiles, scale, stride, tile_vecs};
    int status = 0;
    /* no more threads than tiles; one thread (a lone decode row, or torch at one thread) runs on the
     * calling thread with no parallel region: libgomp's team set-up costs a microsecond a layer */
    int team = num_threads < 1 ? 1 : (num_tiles < num_threads ? (int)(num_tiles > 0 ? num_tiles : 1) : num_threads);
    if (team == 1) {
        status = run_tiles(&st, 0);
    } else {
#pragma omp parallel num_threads(team)
        {
            int mine = run_tiles(&st, 1);
            if (mine) {
#pragma omp atomic write
                status = mine;
            }
        }
    }
    free(tiles);
    free(owned);
    return status;
}
