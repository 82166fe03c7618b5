/* llama.cpp's Q8_0, Q4_0 and Q4_1 weight blocks times a few float32 rows, the blocks read as they lie.
 *
 * Why: a decode step of a few rows reads every weight once for two flops each, so its time is the bytes
 * it streams. Dense float32 weights are 4 bytes a weight; these blocks are 1.06 (Q8_0), 0.56 (Q4_0) and
 * 0.63 (Q4_1). torch has no fast product of packed blocks and float32 rows on the CPU (its int4 pack
 * op ran 5.7x slower than the dense matmul on AVX2, benchmarks/RESULTS.md issue 24, "Fifteenth round").
 *
 * A block holds 32 inputs of one output: float16 d (and m for Q4_1), then the codes q (Q4: input j in
 * the low nibble of byte j, input j + 16 in its high nibble). The weight is d * q (Q8_0), d * (q - 8)
 * (Q4_0) or d * q + m (Q4_1), m = -8d for Q4_0 and 0 for Q8_0; the codes convert to float exactly. Two
 * forms of one block's share of an output:
 * - the codes' form, for calls of 1-2 rows: d * (x . q) + m * sum(x), the sums of x taken once per call
 *   and shared by every output (the least decoding per product);
 * - the weights' form, from 3 rows on, in passes of 8 rows: the block decoded once into its 32 weights
 *   d * q + m, then 4 fused multiply-adds per row (1.12-1.23x the codes' form at 8-64 rows; RESULTS.md
 *   issue 24, "Sixteenth round"). A step's weights come from DRAM, so one pass per 8 rows beat the dense
 *   float32 matmul up to 64 rows on an AVX2 host (emulated).
 * The float32 sums run in another order than a dense matmul's, so results differ from it by float32
 * rounding, never by the weights.
 *
 * Each output is one thread's sum over its blocks in a fixed order, so its bits do not depend on the
 * thread count, nor on the values of the other rows; the form and the accumulators per row follow the
 * row count of the call (a pass), so a row's bits may differ between calls of different row counts, by
 * float32 rounding (the batch-invariant mode takes the dense copy for every product). AVX2 only (every x86
 * CPU since Haswell): a scalar form would lose to the dense matmul, so elsewhere ``pf_gguf_matvec_simd``
 * says 0 and the engine keeps its dense path. Built by kernels/native_build.py.
 */
#include <stdint.h>
#include <omp.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define BLOCK 32
#define GROUP_ROWS 8 /* rows that share one pass over the weights: each block is decoded once for them */
#define CODES_MAX_ROWS 2 /* calls of up to this many rows take one_output_codes */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

ALWAYS_INLINE float half_at(const uint8_t *p) {
    uint16_t bits;
    memcpy(&bits, p, sizeof bits);
#ifdef __F16C__
    return _cvtsh_ss(bits);
#else
    _Float16 h;
    memcpy(&h, &bits, sizeof h);
    return (float)h;
#endif
}

/* A block's scale d and offset m (w = d * q + m; m = -8d for Q4_0, 0 for Q8_0) and where its codes lie. */
ALWAYS_INLINE const uint8_t *block_head(int kind, const uint8_t *blk, float *d, float *m) {
    *d = half_at(blk);
    *m = kind == Q4_1 ? half_at(blk + 2) : (kind == Q4_0 ? -8.0f * *d : 0.0f);
    return blk + (kind == Q4_1 ? 4 : 2);
}

#ifdef __AVX2__
/* The 32 codes of a block as four vectors of 8 floats, inputs 0-7, 8-15, 16-23, 24-31. */
ALWAYS_INLINE void decode(int kind, const uint8_t *qs, __m256 q[4]) {
    if (kind == Q8_0) {
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i))));
        return;
    }
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), low4 = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Few rows (at most CODES_MAX_ROWS in the call): a block's share d * (x . q) + m * sum(x), the codes
 * multiplied as they are and the scale applied once per row and block. This decodes less per product
 * than the weights' form below, which wins from 3 rows on (RESULTS.md issue 24, "Sixteenth round"). */
ALWAYS_INLINE void one_output_codes(int kind, const int rows, const uint8_t *w, int64_t blocks, int64_t bytes,
                                    const float *x, int64_t x_stride, const float *sums, float *out,
                                    int64_t out_stride) {
    __m256 acc[CODES_MAX_ROWS];
    float acc_m[CODES_MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps(), acc_m[r] = 0.0f;
    for (int64_t b = 0; b < blocks; b++) {
        float d, m;
        __m256 q[4];
        decode(kind, block_head(kind, w + b * bytes, &d, &m), q);
        const __m256 dv = _mm256_set1_ps(d);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + r * x_stride + b * BLOCK;
            __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xr), q[0]);
            t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), q[1], t);
            t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), q[2], t);
            t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), q[3], t);
            acc[r] = _mm256_fmadd_ps(dv, t, acc[r]);
            acc_m[r] += m * sums[r * blocks + b];
        }
    }
    for (int r = 0; r < rows; r++) out[r * out_stride] = hsum8(acc[r]) + acc_m[r];
}

/* Accumulators per row in the weights' form: each a chain of fused multiply-adds. Fewer rows take more
 * chains each, so that about 8 products are in flight (hiding the FMA latency) with 8 registers at most. */
#define CHAINS(rows) ((rows) <= 2 ? 4 : ((rows) <= 4 ? 2 : 1))

/* One output against ``rows`` in the weights' form (``rows`` a constant once inlined: the accumulators
 * stay in registers): each block is decoded once into its 32 float32 weights d * q + m (one fused
 * multiply-add each), then multiplied into every row. Per product that is 4 fused multiply-adds and a
 * share of one decode, against 6 operations for the codes' form above. */
ALWAYS_INLINE void one_output(int kind, const int rows, const uint8_t *w, int64_t blocks, int64_t bytes,
                              const float *x, int64_t x_stride, float *out, int64_t out_stride) {
    const int chains = CHAINS(rows);
    __m256 acc[GROUP_ROWS][4];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < chains; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        float d, m;
        __m256 q[4];
        decode(kind, block_head(kind, w + b * bytes, &d, &m), q);
        const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
        for (int i = 0; i < 4; i++) q[i] = _mm256_fmadd_ps(dv, q[i], mv);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + r * x_stride + b * BLOCK;
            for (int i = 0; i < 4; i++)
                acc[r][i % chains] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * i), q[i], acc[r][i % chains]);
        }
    }
    for (int r = 0; r < rows; r++) {
        __m256 total = acc[r][0];
        for (int c = 1; c < chains; c++) total = _mm256_add_ps(total, acc[r][c]);
        out[r * out_stride] = hsum8(total);
    }
}
#endif

int pf_gguf_matvec_simd(void) {
#ifdef __AVX2__
    return 1;
#else
    return 0;
#endif
}

#ifdef __AVX2__
/* Outputs first..last-1 against a group of ``rows`` rows, specialised per row count; ``sums`` (the codes'
 * form) for a call of at most CODES_MAX_ROWS rows, else NULL (the weights' form). */
static void outputs(int kind, int rows, const uint8_t *w, int64_t first, int64_t last, int64_t blocks,
                    int64_t bytes, const float *x, int64_t x_stride, const float *sums, float *out,
                    int64_t out_stride) {
#define CODES(R)                                                                                            \
    for (int64_t n = first; n < last; n++)                                                                  \
        one_output_codes(kind, R, w + n * blocks * bytes, blocks, bytes, x, x_stride, sums, out + n, out_stride); \
    break;
#define WEIGHTS(R)                                                                                  \
    for (int64_t n = first; n < last; n++)                                                          \
        one_output(kind, R, w + n * blocks * bytes, blocks, bytes, x, x_stride, out + n, out_stride); \
    break;
    if (sums != NULL) {
        switch (rows) {
        case 1: CODES(1)
        default: CODES(2)
        }
        return;
    }
    switch (rows) {
    case 1: WEIGHTS(1)
    case 2: WEIGHTS(2)
    case 3: WEIGHTS(3)
    case 4: WEIGHTS(4)
    case 5: WEIGHTS(5)
    case 6: WEIGHTS(6)
    case 7: WEIGHTS(7)
    default: WEIGHTS(8)
    }
#undef CODES
#undef WEIGHTS
}

/* out[r, n] = sum_k x[r, k] * W[n, k] for W given as ``n_out`` rows of ``k / 32`` blocks of ``kind``
 * (0 Q8_0, 1 Q4_0, 2 Q4_1), x rows ``x_stride`` floats apart, out rows ``out_stride`` apart, in passes of
 * GROUP_ROWS rows. Outputs are split over ``threads`` (1: no OpenMP region at all).
 * 0, or -1 for an unknown kind or k not a multiple of 32. */
int pf_gguf_matvec(int kind, const uint8_t *w, int64_t n_out, int64_t k, const float *x, int64_t x_stride,
                   int64_t rows, float *out, int64_t out_stride, int threads) {
    if (kind < Q8_0 || kind > Q4_1 || k % BLOCK) return -1;
    const int64_t blocks = k / BLOCK, bytes = kind == Q8_0 ? 34 : (kind == Q4_0 ? 18 : 20);
    const int codes = rows <= CODES_MAX_ROWS;
    float sums[codes && rows > 0 ? rows * blocks : 1]; /* the codes' form: each row's block sums, at most 2 x k / 32 */
    for (int64_t r = 0; codes && r < rows; r++)
        for (int64_t b = 0; b < blocks; b++) {
            const float *xb = x + r * x_stride + b * BLOCK;
            float s = 0.0f;
            for (int j = 0; j < BLOCK; j++) s += xb[j];
            sums[r * blocks + b] = s;
        }
    for (int64_t r0 = 0; r0 < rows; r0 += GROUP_ROWS) {
        const int group = rows - r0 < GROUP_ROWS ? (int)(rows - r0) : GROUP_ROWS;
        const float *xg = x + r0 * x_stride, *sg = codes ? sums + r0 * blocks : NULL;
        float *og = out + r0 * out_stride;
        if (threads <= 1 || n_out < 2 * threads) {
            outputs(kind, group, w, 0, n_out, blocks, bytes, xg, x_stride, sg, og, out_stride);
            continue;
        }
#pragma omp parallel num_threads(threads)
        {
            /* contiguous shares of the outputs, one per thread: each output is still one thread's sum */
            const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
            const int64_t first = n_out * me / team, last = n_out * (me + 1) / team;
            outputs(kind, group, w, first, last, blocks, bytes, xg, x_stride, sg, og, out_stride);
        }
    }
    return 0;
}
#endif
