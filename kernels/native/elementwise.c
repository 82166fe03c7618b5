/* A decoder layer's elementwise ops on bf16 rows, one call each: RMSNorm (with the residual add),
 * rotary embedding of q and k, and SiLU(gate) * up.
 *
 * Why: at a small batch each of these is a handful of torch calls on a few KiB (casts to float32, the
 * op, a multiply, a cast back), and each call costs microseconds of dispatch whatever its size. Over 30
 * layers that is a fixed cost per decode step of the same order as the arithmetic of a batch-8 step, and
 * it runs on one thread however many the step has (RESULTS.md issue 24, "Twelfth round"). Here each op
 * is one pass over its rows, float32 in registers, rounded once into bf16 (round to nearest even).
 *
 * Each row's arithmetic depends only on that row, never on the row count or the thread count, so the
 * batch-invariant mode keeps its guarantee. Rotary is the reference's arithmetic bit for bit (products
 * rounded to float32 before they are added, hence no fused multiply-add here); the norm's sum of squares
 * (16 lanes, a fixed tree) and SiLU's exp (a polynomial) may differ from torch's in the last float32
 * bit, so an output can differ by one bf16 rounding step. Built by kernels/native_build.py.
 */
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
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

static inline void norm_row(const uint16_t *xr, const uint16_t *rr, const uint16_t *weight, uint16_t *o,
                            uint16_t *nr, int chunks, int hidden, float eps) {
    const uint16_t *src = xr;
    v16 acc = {0};
    if (rr != NULL) {
        for (int c = 0; c < chunks; c++) {
            v16 v = as_bf16(load_bf16(xr + c * LANES) + load_bf16(rr + c * LANES));
            store_bf16(nr + c * LANES, v);
            acc += v * v;
        }
        src = nr;
    } else {
        for (int c = 0; c < chunks; c++) {
            v16 v = load_bf16(xr + c * LANES);
            acc += v * v;
        }
    }
    const float inv = 1.0f / sqrtf(sum16(acc) / (float)hidden + eps);
    for (int c = 0; c < chunks; c++) {
        v16 normed = as_bf16(load_bf16(src + c * LANES) * inv);
        store_bf16(o + c * LANES, load_bf16(weight + c * LANES) * normed);
    }
}

/* out = w * bf16(r / rms(r)), r = bf16(x + residual) (written to new_residual), or r = x without a
 * residual. Rows of ``hidden`` elements; x and residual rows ``*_stride`` elements apart, the outputs
 * contiguous. 0, or -1 when hidden is not a multiple of 16. */
int pf_rms_norm(const uint16_t *x, int64_t x_stride, const uint16_t *residual, int64_t residual_stride,
                const uint16_t *weight, uint16_t *out, uint16_t *new_residual, int64_t rows, int hidden,
                float eps) {
    if (hidden % LANES) return -1;
    const int chunks = hidden / LANES;
    FOR_ROWS(rows, rows * hidden,
             norm_row(x + row * x_stride, residual ? residual + row * residual_stride : NULL, weight,
                      out + row * hidden, residual ? new_residual + row * hidden : NULL, chunks, hidden, eps));
    return 0;
}

/* Neox rotary of one head: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), each half ``half`` wide. */
static inline void rotate_head(const uint16_t *x, uint16_t *o, const float *cos, const float *sin, int half) {
    for (int c = 0; c < half; c += LANES) {
        v16 x1 = load_bf16(x + c), x2 = load_bf16(x + half + c), cs, sn;
        memcpy(&cs, cos + c, sizeof cs);
        memcpy(&sn, sin + c, sizeof sn);
        v16 a = x1 * cs, b = x2 * sn, d = x2 * cs, e = x1 * sn;
        store_bf16(o + c, a - b);
        store_bf16(o + half + c, d + e);
    }
}

static inline void rotary_row(const uint16_t *q, int q_heads, const uint16_t *k, int k_heads, int head_dim,
                              const float *cos, uint16_t *q_out, uint16_t *k_out) {
    const int half = head_dim / 2;
    const float *sin = cos + half;
    for (int h = 0; h < q_heads; h++) rotate_head(q + h * head_dim, q_out + h * head_dim, cos, sin, half);
    for (int h = 0; h < k_heads; h++) rotate_head(k + h * head_dim, k_out + h * head_dim, cos, sin, half);
}

/* Rotary embedding of q [rows, q_heads, head_dim] and k [rows, k_heads, head_dim] (rows ``*_stride``
 * elements apart, heads contiguous) into contiguous outputs, at ``positions`` (int64) of a float32
 * cache [max_position, head_dim] of cos then sin. 0, or -1 when head_dim / 2 is not a multiple of 16,
 * -2 when a position lies outside the cache. */
int pf_rotary(const uint16_t *q, int64_t q_stride, int q_heads, const uint16_t *k, int64_t k_stride, int k_heads,
              int head_dim, const int64_t *positions, const float *cache, int64_t max_position, uint16_t *q_out,
              uint16_t *k_out, int64_t rows) {
    const int half = head_dim / 2;
    if (half % LANES) return -1;
    for (int64_t row = 0; row < rows; row++)
        if (positions[row] < 0 || positions[row] >= max_position) return -2;
    FOR_ROWS(rows, rows * (q_heads + k_heads) * head_dim,
             rotary_row(q + row * q_stride, q_heads, k + row * k_stride, k_heads, head_dim,
                        cache + positions[row] * head_dim, q_out + row * q_heads * head_dim,
                        k_out + row * k_heads * head_dim));
    return 0;
}

static inline void silu_row(const uint16_t *g, int inter, uint16_t *o) {
    const uint16_t *u = g + inter;
    for (int c = 0; c < inter; c += LANES) {
        v16 gate = load_bf16(g + c);
        store_bf16(o + c, gate / (exp16(-gate) + 1.0f) * load_bf16(u + c));
    }
}

/* out[r] = silu(x[r, :inter]) * x[r, inter:], silu(g) = g / (1 + exp(-g)); x rows ``x_stride`` apart,
 * out contiguous. 0, or -1 when inter is not a multiple of 16. */
int pf_silu_and_mul(const uint16_t *x, int64_t x_stride, int inter, uint16_t *out, int64_t rows) {
    if (inter % LANES) return -1;
    FOR_ROWS(rows, rows * inter, silu_row(x + row * x_stride, inter, out + row * inter));
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
