/* A decoder layer's elementwise ops on bf16 or float32 rows, one call each: RMSNorm (with the residual
 * add), rotary embedding of q and k, and SiLU(gate) * up.
 *
 * Why: at a small batch each of these is a handful of torch calls on a few KiB (casts to float32, the
 * op, a multiply, a cast back), and each call costs microseconds of dispatch whatever its size. Over 30
 * layers that is a fixed cost per decode step of the same order as the arithmetic of a batch-8 step, and
 * it runs on one thread however many the step has (RESULTS.md issue 24, "Twelfth round"). Here each op
 * is one pass over its rows, float32 in registers, rounded once into bf16 (round to nearest even) or
 * stored as is for float32 rows (``f32`` = 1: the float32 default of a CPU without native bf16).
 *
 * Each row's arithmetic depends only on that row, never on the row count or the thread count, so the
 * batch-invariant mode keeps its guarantee. Rotary is the reference's arithmetic bit for bit (products
 * rounded to float32 before they are added, hence no fused multiply-add here); the norm's sum of squares
 * (16 lanes, a fixed tree) and SiLU's exp (a polynomial) may differ from torch's in the last float32
 * bit, so a bf16 output can differ by one bf16 rounding step, a float32 one by a few float32 ulps.
 * Built by kernels/native_build.py.
 */
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define PARALLEL_MIN_ELEMENTS 16384 /* below this a call runs on one thread: a team costs more than it saves */

/* ``call`` for every row (``row``), over the OpenMP team from PARALLEL_MIN_ELEMENTS elements of work on,
 * else on the calling thread with no parallel region at all: even a region of one thread costs libgomp a
 * team set-up, about a microsecond, four calls a layer (RESULTS.md issue 24, "Fourteenth round"). */
#define FOR_ROWS(rows, work, call)                                                    \
    do {                                                                              \
        if ((work) >= PARALLEL_MIN_ELEMENTS) {                                        \
            _Pragma("omp parallel for schedule(static)") for (int64_t row = 0; row < (rows); row++) call; \
        } else {                                                                      \
            for (int64_t row = 0; row < (rows); row++) call;                          \
        }                                                                             \
    } while (0)

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef uint16_t h16v __attribute__((vector_size(32)));

static inline v16 load_bf16(const uint16_t *src) {
    h16v h;
    memcpy(&h, src, sizeof h);
    u16v u = __builtin_convertvector(h, u16v) << 16;
    v16 r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion does (a NaN stays a quiet NaN). */
static inline h16v round_bf16(v16 x) {
    u16v u;
    memcpy(&u, &x, sizeof u);
    u16v rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    u16v quiet = (u >> 16) | 0x40u;
    u16v nan = (u16v)((u & 0x7fffffffu) > 0x7f800000u);
    return __builtin_convertvector((rounded & ~nan) | (quiet & nan), h16v);
}

static inline void store_bf16(uint16_t *dst, v16 x) {
    h16v h = round_bf16(x);
    memcpy(dst, &h, sizeof h);
}

/* The value a float32 takes once stored as bf16 and read back. */
static inline v16 as_bf16(v16 x) {
    u16v u = __builtin_convertvector(round_bf16(x), u16v) << 16;
    v16 r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* Rows of bf16 (f32 = 0) or float32 (f32 = 1): a constant once inlined, so each entry point below
 * compiles one loop per element type. */
ALWAYS_INLINE v16 load_row(const void *p, int64_t i, const int f32) {
    if (!f32) return load_bf16((const uint16_t *)p + i);
    v16 r;
    memcpy(&r, (const float *)p + i, sizeof r);
    return r;
}

ALWAYS_INLINE void store_row(void *p, int64_t i, v16 x, const int f32) {
    if (f32)
        memcpy((float *)p + i, &x, sizeof x);
    else
        store_bf16((uint16_t *)p + i, x);
}

/* The value x takes once stored in a row of the element type and read back. */
ALWAYS_INLINE v16 as_row(v16 x, const int f32) { return f32 ? x : as_bf16(x); }

static inline float sum16(v16 v) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline v16 select16(i16v mask, v16 a, v16 b) {
    i16v ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    i16v r = (ai & mask) | (bi & ~mask);
    v16 out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* exp(x), Cephes' range reduction and polynomial (about 2 ulp), x clamped to [-87, 88]; rounding to
 * the nearest integer by adding and subtracting 1.5 * 2^23. All lanewise vector code. */
static inline v16 exp16(v16 x) {
    const v16 zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;
    x = select16(x < lo, lo, x);
    x = select16(x > hi, hi, x);
    v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    v16 r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    i16v bits = (__builtin_convertvector(n, i16v) + 127) << 23;
    v16 s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

/* One row of the norm; ``xo``, ``ro`` and ``oo`` are the row's element offsets in x, the residual and the
 * outputs (the new residual shares the output's). */
ALWAYS_INLINE void norm_row(const void *x, int64_t xo, const void *res, int64_t ro, const void *weight, void *o,
                            int64_t oo, void *nr, int chunks, int hidden, float eps, const int f32) {
    const void *src = x;
    int64_t so = xo;
    v16 acc = {0};
    if (res != NULL) {
        for (int c = 0; c < chunks; c++) {
            v16 v = as_row(load_row(x, xo + c * LANES, f32) + load_row(res, ro + c * LANES, f32), f32);
            store_row(nr, oo + c * LANES, v, f32);
            acc += v * v;
        }
        src = nr, so = oo;
    } else {
        for (int c = 0; c < chunks; c++) {
            v16 v = load_row(x, xo + c * LANES, f32);
            acc += v * v;
        }
    }
    const float inv = 1.0f / sqrtf(sum16(acc) / (float)hidden + eps);
    for (int c = 0; c < chunks; c++) {
        v16 normed = as_row(load_row(src, so + c * LANES, f32) * inv, f32);
        store_row(o, oo + c * LANES, load_row(weight, c * LANES, f32) * normed, f32);
    }
}

/* out = w * r / rms(r) (the normalised r rounded to the element type before the weight), r = x + residual
 * (rounded likewise; written to new_residual), or r = x without a residual. Rows of ``hidden`` elements,
 * bf16 (f32 = 0) or float32 (f32 = 1), weight included; x and residual rows ``*_stride`` elements apart,
 * the outputs contiguous. 0, or -1 when hidden is not a multiple of 16. */
int pf_rms_norm(const void *x, int64_t x_stride, const void *residual, int64_t residual_stride, const void *weight,
                void *out, void *new_residual, int64_t rows, int hidden, float eps, int f32) {
    if (hidden % LANES) return -1;
    const int chunks = hidden / LANES;
#define NORM(F)                                                                                              \
    FOR_ROWS(rows, rows * hidden,                                                                            \
             norm_row(x, row * x_stride, residual, row * residual_stride, weight, out, row * hidden,         \
                      residual ? new_residual : NULL, chunks, hidden, eps, F))
    if (f32)
        NORM(1);
    else
        NORM(0);
#undef NORM
    return 0;
}

/* Neox rotary of one head at element offset ``xo`` (input) and ``oo`` (output): (x1, x2) ->
 * (x1 cos - x2 sin, x2 cos + x1 sin), each half ``half`` wide. */
ALWAYS_INLINE void rotate_head(const void *x, int64_t xo, void *o, int64_t oo, const float *cos, const float *sin,
                               int half, const int f32) {
    for (int c = 0; c < half; c += LANES) {
        v16 x1 = load_row(x, xo + c, f32), x2 = load_row(x, xo + half + c, f32), cs, sn;
        memcpy(&cs, cos + c, sizeof cs);
        memcpy(&sn, sin + c, sizeof sn);
        v16 a = x1 * cs, b = x2 * sn, d = x2 * cs, e = x1 * sn;
        store_row(o, oo + c, a - b, f32);
        store_row(o, oo + half + c, d + e, f32);
    }
}

ALWAYS_INLINE void rotary_row(const void *q, int64_t qo, int q_heads, const void *k, int64_t ko, int k_heads,
                              int head_dim, const float *cos, void *q_out, int64_t qoo, void *k_out, int64_t koo,
                              const int f32) {
    const int half = head_dim / 2;
    const float *sin = cos + half;
    for (int h = 0; h < q_heads; h++) rotate_head(q, qo + h * head_dim, q_out, qoo + h * head_dim, cos, sin, half, f32);
    for (int h = 0; h < k_heads; h++) rotate_head(k, ko + h * head_dim, k_out, koo + h * head_dim, cos, sin, half, f32);
}

/* Rotary embedding of q [rows, q_heads, head_dim] and k [rows, k_heads, head_dim], bf16 (f32 = 0) or float32
 * (f32 = 1) (rows ``*_stride`` elements apart, heads contiguous) into contiguous outputs, at ``positions``
 * (int64) of a float32 cache [max_position, head_dim] of cos then sin. 0, or -1 when head_dim / 2 is not
 * a multiple of 16, -2 when a position lies outside the cache. */
int pf_rotary(const void *q, int64_t q_stride, int q_heads, const void *k, int64_t k_stride, int k_heads,
              int head_dim, const int64_t *positions, const float *cache, int64_t max_position, void *q_out,
              void *k_out, int64_t rows, int f32) {
    const int half = head_dim / 2;
    if (half % LANES) return -1;
    for (int64_t row = 0; row < rows; row++)
        if (positions[row] < 0 || positions[row] >= max_position) return -2;
#define ROTARY(F)                                                                                            \
    FOR_ROWS(rows, rows * (q_heads + k_heads) * head_dim,                                                    \
             rotary_row(q, row * q_stride, q_heads, k, row * k_stride, k_heads, head_dim,                    \
                        cache + positions[row] * head_dim, q_out, row * q_heads * head_dim, k_out,           \
                        row * k_heads * head_dim, F))
    if (f32)
        ROTARY(1);
    else
        ROTARY(0);
#undef ROTARY
    return 0;
}

ALWAYS_INLINE void silu_row(const void *x, int64_t xo, int inter, void *o, int64_t oo, const int f32) {
    for (int c = 0; c < inter; c += LANES) {
        v16 gate = load_row(x, xo + c, f32);
        store_row(o, oo + c, gate / (exp16(-gate) + 1.0f) * load_row(x, xo + inter + c, f32), f32);
    }
}

/* out[r] = silu(x[r, :inter]) * x[r, inter:], silu(g) = g / (1 + exp(-g)); bf16 (f32 = 0) or float32
 * (f32 = 1) rows ``x_stride`` elements apart, out contiguous. 0, or -1 when inter is not a multiple of 16. */
int pf_silu_and_mul(const void *x, int64_t x_stride, int inter, void *out, int64_t rows, int f32) {
    if (inter % LANES) return -1;
    if (f32)
        FOR_ROWS(rows, rows * inter, silu_row(x, row * x_stride, inter, out, row * inter, 1));
    else
        FOR_ROWS(rows, rows * inter, silu_row(x, row * x_stride, inter, out, row * inter, 0));
    return 0;
}

/* The paged KV store: key and value row r (``row_bytes`` each: a token's heads, contiguous; rows
 * ``*_stride`` bytes apart) copied into slot ``slots[r]`` of each cache of ``num_slots`` slots; a negative
 * slot is skipped (padding, tokens already cached). Any dtype, the caches' own: a byte copy. 0, or -2
 * when a slot lies outside the caches (checked before anything is written). */
int pf_store_kv(const char *key, int64_t key_stride, const char *value, int64_t value_stride, char *k_cache,
                char *v_cache, int64_t num_slots, const int64_t *slots, int64_t rows, int64_t row_bytes) {
    for (int64_t row = 0; row < rows; row++)
        if (slots[row] >= num_slots) return -2;
    /* work in 16-byte units: a copy moves a cache line faster than an op computes its elements */
    FOR_ROWS(rows, rows * row_bytes / 16, if (slots[row] >= 0) {
        memcpy(k_cache + slots[row] * row_bytes, key + row * key_stride, (size_t)row_bytes);
        memcpy(v_cache + slots[row] * row_bytes, value + row * value_stride, (size_t)row_bytes);
    });
    return 0;
}
