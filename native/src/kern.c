/* The per-path kernels, compiled once per vector path with SKN_PATH set:
 *   SKN_PATH_SCALAR  portable C11, one value at a time (VW = 1; auto-vectorisation off)
 *   SKN_PATH_SSE4    x86-64-v2 (SSE4.2, 128-bit: VW = 4; fp16 by integer operations)
 *   SKN_PATH_AVX2    AVX2 + F16C (256-bit: VW = 8; fp16 by vcvtps2ph)
 *   SKN_PATH_NEON    aarch64 Advanced SIMD (128-bit: VW = 4; fp16 by FCVTN)
 * The vector paths use GCC/Clang vector extensions, whose arithmetic is lane-wise IEEE float32,
 * the same operations in the same order as the scalar path and as numba's kernels (no FMA
 * contraction: built with -ffp-contract=off), so every path gives the same bits. */
#include <string.h>

#include "skn_internal.h"

#if defined(SKN_PATH_AVX2)
#define VW 8
#define PATH_NAME "avx2"
#define SFX(x) x##_avx2
#include <immintrin.h>
#elif defined(SKN_PATH_SSE4)
#define VW 4
#define PATH_NAME "sse4"
#define SFX(x) x##_sse4
#include <immintrin.h>
#elif defined(SKN_PATH_NEON)
#define VW 4
#define PATH_NAME "neon"
#define SFX(x) x##_neon
#include <arm_neon.h>
#else
#define VW 1
#define PATH_NAME "scalar"
#define SFX(x) x##_scalar
#endif

#if VW == 1
typedef float VF;
typedef uint32_t VU;
static SKN_INLINE VF vload(const float *p) { return *p; }
static SKN_INLINE void vstore(float *p, VF v) { *p = v; }
#else
typedef float VF __attribute__((vector_size(VW * 4)));
typedef uint32_t VU __attribute__((vector_size(VW * 4)));
typedef int32_t VI __attribute__((vector_size(VW * 4)));
static SKN_INLINE VF vload(const float *p) { VF v; memcpy(&v, p, sizeof v); return v; }
static SKN_INLINE void vstore(float *p, VF v) { memcpy(p, &v, sizeof v); }
#endif

#define SKN_HAVE_VF 1
#if VW > 1
#define SKN_WANT_EXPAND 1
#endif
#include "gen_tables.h"

/* float32 -> fp16 bits, round to nearest even (F. Giesen's float_to_half_fast3_rtne: equal to a
 * hardware conversion on every finite value and infinity; NaN -> 0x7e00 with the sign). */
static SKN_INLINE uint16_t f16_scalar(float x)
{
    uint32_t f;
    memcpy(&f, &x, 4);
    const uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint32_t o;
    if (f >= (143u << 23)) {
        o = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (f < (113u << 23)) {
        float a;
        memcpy(&a, &f, 4);
        a += 0.5f;                               /* denorm magic: ((127 - 15) + (23 - 10) + 1) << 23 */
        uint32_t u;
        memcpy(&u, &a, 4);
        o = u - 0x3f000000u;
    } else {
        const uint32_t odd = (f >> 13) & 1u;
        o = (f + (((uint32_t)(15 - 127) << 23) + 0xfffu) + odd) >> 13;
    }
    return (uint16_t)(o | (sign >> 16));
}

#if VW > 1
/* VW values at once: the vector form of f16_scalar (for paths without a conversion instruction). */
static SKN_INLINE void f16_vec(VF x, uint16_t *out)
{
#if defined(SKN_PATH_AVX2)
    __m128i h = _mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT);
    memcpy(out, &h, 16);
#elif defined(SKN_PATH_NEON)
    float16x4_t h = vcvt_f16_f32((float32x4_t)x);
    vst1_u16(out, vreinterpret_u16_f16(h));
#else
    VU f;
    memcpy(&f, &x, sizeof f);
    const VU sign = f & 0x80000000u;
    f ^= sign;
    VF a;
    memcpy(&a, &f, sizeof a);
    VF ad = a + 0.5f;
    VU du;
    memcpy(&du, &ad, sizeof du);
    const VU den = du - 0x3f000000u;
    const VU odd = (f >> 13) & 1u;
    const VU nrm = (f + ((((uint32_t)(15 - 127)) << 23) + 0xfffu) + odd) >> 13;
    const VU big = (VU)((VI)(f > 0x7f800000u)) & 0x7e00u;     /* NaN */
    const VU inf = (VU)((VI)(f <= 0x7f800000u)) & 0x7c00u;    /* inf / overflow */
    const VU isbig = (VU)(f >= (143u << 23));
    const VU issub = (VU)(f < (113u << 23));
    VU o = (issub & den) | (~issub & nrm);
    o = (isbig & (big | inf)) | (~isbig & o);
    o |= sign >> 16;
    for (int i = 0; i < VW; i++) out[i] = (uint16_t)o[i];
#endif
}
#endif

#if defined(SKN_PATH_SSE4)
/* 4 float32 -> fp16 bits in the low 16 bits of each int32 lane, round to nearest even: numba's
 * phone-class `_f16_bits_integer` (Giesen's float_to_half_fast3_rtne with the subnormal case as
 * rint(|x| 2^24), the range tests as float compares, the selects as blends): ~14 instructions
 * against ~25 for the generic vector form above (SSE has no unsigned compare). Equal to f16_scalar
 * on every input. */
static SKN_INLINE __m128i f16x4_sse4(__m128 x)
{
    const __m128i f = _mm_castps_si128(x);
    const __m128i sign = _mm_and_si128(f, _mm_set1_epi32((int)0x80000000u));
    const __m128i a = _mm_xor_si128(f, sign);
    const __m128 ax = _mm_castsi128_ps(a);
    const __m128i odd = _mm_and_si128(_mm_srli_epi32(a, 13), _mm_set1_epi32(1));
    const __m128i nrm = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32((int)(((uint32_t)(15 - 127) << 23) + 0xfffu))), odd), 13);
    const __m128i sub = _mm_cvttps_epi32(_mm_round_ps(_mm_mul_ps(ax, _mm_set1_ps(16777216.0f)),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m128 o = _mm_blendv_ps(_mm_castsi128_ps(sub), _mm_castsi128_ps(nrm), _mm_cmpge_ps(ax, _mm_set1_ps(0x1p-14f)));
    const __m128 big = _mm_blendv_ps(_mm_castsi128_ps(_mm_set1_epi32(0x7c00)), _mm_castsi128_ps(_mm_set1_epi32(0x7e00)),
                                     _mm_cmpunord_ps(ax, ax));
    o = _mm_blendv_ps(o, big, _mm_cmpnlt_ps(ax, _mm_set1_ps(65536.0f)));   /* (true for NaN too) */
    return _mm_or_si128(_mm_castps_si128(o), _mm_srli_epi32(sign, 16));
}
#endif

static void SFX(to_f16)(const float *x, size_t n, uint16_t *out)
{
    size_t i = 0;
#if defined(SKN_PATH_SSE4)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm_packus_epi32(f16x4_sse4(_mm_loadu_ps(x + i)), f16x4_sse4(_mm_loadu_ps(x + i + 4))));
#endif
#if VW > 1
    for (; i + VW <= n; i += VW) f16_vec(vload(x + i), out + i);
#endif
    for (; i < n; i++) out[i] = f16_scalar(x[i]);
}

/* one row of CB values: out16[c] = fp16(src[c] / d + mu[c]) (or without the division) */
static SKN_INLINE void finish_row(const float *src, const float *mu, const float *dptr, int cb, uint16_t *o16)
{
    int c = 0;
#if defined(SKN_PATH_SSE4)
    /* 8 per step: two conversions packed into one 16-byte store */
    if (dptr) {
        const __m128 d = _mm_set1_ps(*dptr);
        for (; c + 8 <= cb; c += 8) {
            const __m128i lo = f16x4_sse4(_mm_add_ps(_mm_div_ps(_mm_loadu_ps(src + c), d), _mm_loadu_ps(mu + c)));
            const __m128i hi = f16x4_sse4(_mm_add_ps(_mm_div_ps(_mm_loadu_ps(src + c + 4), d), _mm_loadu_ps(mu + c + 4)));
            _mm_storeu_si128((__m128i *)(o16 + c), _mm_packus_epi32(lo, hi));
        }
    } else {
        for (; c + 8 <= cb; c += 8) {
            const __m128i lo = f16x4_sse4(_mm_add_ps(_mm_loadu_ps(src + c), _mm_loadu_ps(mu + c)));
            const __m128i hi = f16x4_sse4(_mm_add_ps(_mm_loadu_ps(src + c + 4), _mm_loadu_ps(mu + c + 4)));
            _mm_storeu_si128((__m128i *)(o16 + c), _mm_packus_epi32(lo, hi));
        }
    }
#endif
#if VW > 1
    if (dptr) {
        const float d = *dptr;
        for (; c + VW <= cb; c += VW) f16_vec(vload(src + c) / d + vload(mu + c), o16 + c);
    } else {
        for (; c + VW <= cb; c += VW) f16_vec(vload(src + c) + vload(mu + c), o16 + c);
    }
#endif
    for (; c < cb; c++) o16[c] = f16_scalar(dptr ? src[c] / *dptr + mu[c] : src[c] + mu[c]);
}

/* One channel block (channels [c0, c0 + cbw)) of one part: the dead-zone reconstruction of the
 * block's channels (band-sorted rows scattered to their token-grid rows) into the block buffer fl
 * (grid row u at u * rs, column v at v * cb), pass 1 (over u) in place, pass 2 (over v) in place
 * on each grid row, then / scale + mean and fp16 into the output rows (numba's `idct2_<n>`).
 * The output rows are C values apart and a block writes cb of each: at 4,096 tokens ~40 % of the
 * kernel's samples sit on the fp16 store (store misses; with 4 KiB pages a TLB miss per row, which
 * is why the caller's output gets the huge-page hint). Prefetching the next grid row's output rows
 * for writing was measured: no gain. */
/* the dead-zone reconstruction of k values: sign (q + off) step, 0 where q is 0 */
#define DEADZONE(MAGT)                                                                                \
static SKN_INLINE void deadzone_##MAGT(const MAGT *mr, const uint8_t *nr, float step, float off, float *dst, int k) \
{                                                                                                     \
    for (int c = 0; c < k; c++) {                                                                     \
        const MAGT q = mr[c];                                                                         \
        float v = ((float)q + off) * step;                                                            \
        v = nr[c] ? -v : v;                                                                           \
        dst[c] = q != 0 ? v : 0.0f;                                                                   \
    }                                                                                                 \
}
DEADZONE(int16_t)
DEADZONE(int32_t)

/* skn_block_channels(N) as a constant expression: the block buffer's strides and the passes' trip
 * counts are compile-time constants (immediate addressing for pass 1's n column loads, no remainder
 * loops; numba's kernels are compiled so too); a tail block (C % width channels) is transformed
 * as a whole block whose missing channels are zeros (the passes work column by column: the extra
 * columns change nothing in the others) and only its own channels are written. */
#define BLOCK_CH(N) ((1 << 16) / ((N) * (N)) > 64 ? 64 : (1 << 16) / ((N) * (N)) < 32 ? 32 : (1 << 16) / ((N) * (N)))
#define IDCT_KERNEL(N, MAGT)                                                                          \
static void SFX(idct2_##N##_##MAGT)(const MAGT *mag, const uint8_t *neg, const int32_t *perm, float step, \
                                    float off, int32_t c0, int32_t cbw, const float *inv, const float *mu, \
                                    int32_t C, uint16_t *out, float *fl)                             \
{                                                                                                     \
    enum { n = N, T = N * N };                                                                        \
    enum { cb = BLOCK_CH(N), rs = N * BLOCK_CH(N) + 16, lg = __builtin_ctz(N) };                      \
    for (int r = 0; r < T; r++) {                                                                     \
        if (r + 8 < T) {   /* rows are C values apart: prefetch 8 rows ahead (the prefetchers miss) */ \
            const size_t ahead = (size_t)(r + 8) * C + (size_t)c0;                                    \
            for (int pq = 0; pq < cbw; pq += 64 / (int)sizeof(MAGT)) __builtin_prefetch(mag + ahead + pq); \
            __builtin_prefetch(neg + ahead);                                                          \
            __builtin_prefetch(neg + ahead + cbw - 1);                                                \
        }                                                                                             \
        const uint32_t gi = (uint32_t)perm[r];                                                        \
        float *dst = fl + (size_t)(gi >> lg) * rs + (size_t)(gi & (n - 1)) * cb;                      \
        const size_t src = (size_t)r * C + (size_t)c0;                                                \
        const MAGT *mr = mag + src;                                                                   \
        const uint8_t *nr = neg + src;                                                                \
        if (cbw == cb) deadzone_##MAGT(mr, nr, step, off, dst, cb); /* (constant count: unrolled) */  \
        else {                                                                                        \
            deadzone_##MAGT(mr, nr, step, off, dst, cbw);                                             \
            for (int c = cbw; c < cb; c++) dst[c] = 0.0f; /* (a tail block: zero channels, no output) */ \
        }                                                                                             \
    }                                                                                                 \
    VF col[N];                                                                                        \
    float cs[N];                                                                                      \
    int q = 0;                                          /* pass 1: over u, every (v, c) column */     \
    for (; q + VW <= n * cb; q += VW) {                                                               \
        for (int u = 0; u < n; u++) col[u] = vload(fl + q + (size_t)u * rs);                          \
        idct_##N(col);                                                                                \
        for (int u = 0; u < n; u++) vstore(fl + q + (size_t)u * rs, col[u]);                          \
    }                                                                                                 \
    for (; q < n * cb; q++) {                                                                         \
        for (int u = 0; u < n; u++) cs[u] = fl[q + (size_t)u * rs];                                   \
        idcts_##N(cs);                                                                                \
        for (int u = 0; u < n; u++) fl[q + (size_t)u * rs] = cs[u];                                   \
    }                                                                                                 \
    for (int i = 0; i < n; i++) {                       /* pass 2: over v, per grid row i */          \
        float *row = fl + (size_t)i * rs;                                                             \
        int c = 0;                                                                                    \
        for (; c + VW <= cb; c += VW) {                                                               \
            for (int v = 0; v < n; v++) col[v] = vload(row + c + (size_t)v * cb);                     \
            idct_##N(col);                                                                            \
            for (int v = 0; v < n; v++) vstore(row + c + (size_t)v * cb, col[v]);                     \
        }                                                                                             \
        for (; c < cb; c++) {                                                                         \
            for (int v = 0; v < n; v++) cs[v] = row[c + (size_t)v * cb];                              \
            idcts_##N(cs);                                                                            \
            for (int v = 0; v < n; v++) row[c + (size_t)v * cb] = cs[v];                              \
        }                                                                                             \
        for (int j = 0; j < n; j++) {                                                                 \
            const int t = i * n + j;                                                                  \
            finish_row(row + (size_t)j * cb, mu + c0, inv ? inv + t : NULL, cbw == cb ? cb : cbw,     \
                       out + (size_t)t * C + (size_t)c0);                                             \
        }                                                                                             \
    }                                                                                                 \
}

#define IDCT_BOTH(N) IDCT_KERNEL(N, int16_t) IDCT_KERNEL(N, int32_t)
IDCT_BOTH(2)
IDCT_BOTH(4)
IDCT_BOTH(8)
IDCT_BOTH(16)
IDCT_BOTH(32)
IDCT_BOTH(64)

/* Channel blocks [lo, hi) of skn_block_channels(n) channels (the last one the C % width tail, if
 * any); scratch holds n x skn_row_stride(n) floats. */
static int SFX(idct2_f16)(int n, int mag32, const void *mag, const uint8_t *neg, const int32_t *perm, float step,
                          float off, int32_t lo, int32_t hi, const float *inv, const float *mu, int32_t C,
                          uint16_t *out, float *scratch)
{
    const int cbf = skn_block_channels(n);
    for (int32_t b = lo; b < hi; b++) {
        const int32_t c0 = b * cbf, cbw = C - c0 < cbf ? C - c0 : cbf;
        if (cbw <= 0) return SKN_E_ARG;
#define CASE(N)                                                                                             \
        case N:                                                                                             \
            if (mag32) SFX(idct2_##N##_int32_t)(mag, neg, perm, step, off, c0, cbw, inv, mu, C, out, scratch); \
            else SFX(idct2_##N##_int16_t)(mag, neg, perm, step, off, c0, cbw, inv, mu, C, out, scratch);       \
            break;
        switch (n) {
            CASE(2) CASE(4) CASE(8) CASE(16) CASE(32) CASE(64)
        default:
            return SKN_E_UNSUPPORTED;
        }
#undef CASE
    }
    return SKN_OK;
}

enum { CG_TILE_T = 256, CG_TILE_C = 64 };

static void SFX(cachegen_f16)(const uint16_t *sym, const float *scale, int32_t mx, int32_t T, int32_t C,
                              int32_t stride, uint16_t *out)
{
    uint16_t tile[CG_TILE_C][CG_TILE_T];
    float row[CG_TILE_T];
    for (int32_t c0 = 0; c0 < C; c0 += CG_TILE_C) {
        const int nc = C - c0 < CG_TILE_C ? C - c0 : CG_TILE_C;
        for (int32_t t0 = 0; t0 < T; t0 += CG_TILE_T) {
            const int nt = T - t0 < CG_TILE_T ? T - t0 : CG_TILE_T;
            for (int cc = 0; cc < nc; cc++) {
                const uint16_t *sc = sym + (size_t)(c0 + cc) * T + t0;
                for (int tt = 0; tt < nt; tt++) row[tt] = (float)((int32_t)sc[tt] - mx) * scale[t0 + tt];
                SFX(to_f16)(row, (size_t)nt, tile[cc]);
            }
            int tt = 0;
#if defined(SKN_PATH_SSE4) || defined(SKN_PATH_AVX2)
            /* the tile's transpose 8 x 8 values at a time (three rounds of 16/32/64-bit unpacks)
               where the channels come in eights; the scalar loop below does the rest */
            if (nc % 8 == 0)
                for (; tt + 8 <= nt; tt += 8)
                    for (int cc = 0; cc < nc; cc += 8) {
                        __m128i r[8], a[8], b[8];
                        for (int k = 0; k < 8; k++) r[k] = _mm_loadu_si128((const __m128i *)(tile[cc + k] + tt));
                        for (int k = 0; k < 4; k++) {
                            a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
                            a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
                        }
                        for (int k = 0; k < 2; k++) {
                            b[4 * k] = _mm_unpacklo_epi32(a[4 * k], a[4 * k + 2]);
                            b[4 * k + 1] = _mm_unpackhi_epi32(a[4 * k], a[4 * k + 2]);
                            b[4 * k + 2] = _mm_unpacklo_epi32(a[4 * k + 1], a[4 * k + 3]);
                            b[4 * k + 3] = _mm_unpackhi_epi32(a[4 * k + 1], a[4 * k + 3]);
                        }
                        for (int k = 0; k < 4; k++) {
                            uint16_t *o0 = out + (size_t)(t0 + tt + 2 * k) * stride + c0 + cc;
                            _mm_storeu_si128((__m128i *)o0, _mm_unpacklo_epi64(b[k], b[k + 4]));
                            _mm_storeu_si128((__m128i *)(o0 + stride), _mm_unpackhi_epi64(b[k], b[k + 4]));
                        }
                    }
#elif defined(SKN_PATH_NEON)
            /* the same with NEON: 16-bit then 32-bit transposes of pairs, then the 64-bit halves */
            if (nc % 8 == 0)
                for (; tt + 8 <= nt; tt += 8)
                    for (int cc = 0; cc < nc; cc += 8) {
                        uint16x8x2_t t[4];
                        for (int k = 0; k < 4; k++)
                            t[k] = vtrnq_u16(vld1q_u16(tile[cc + 2 * k] + tt), vld1q_u16(tile[cc + 2 * k + 1] + tt));
                        uint32x4x2_t u[4];   /* u[0]: rows 0-3, columns (0, 4) / (2, 6); u[1]: (1, 5) / (3, 7);
                                                u[2], u[3]: the same for rows 4-7 */
                        for (int h = 0; h < 2; h++) {
                            u[2 * h] = vtrnq_u32(vreinterpretq_u32_u16(t[2 * h].val[0]), vreinterpretq_u32_u16(t[2 * h + 1].val[0]));
                            u[2 * h + 1] = vtrnq_u32(vreinterpretq_u32_u16(t[2 * h].val[1]), vreinterpretq_u32_u16(t[2 * h + 1].val[1]));
                        }
                        for (int col = 0; col < 8; col++) {
                            /* column col: pair (col & 1) of u, half (col >> 1 & 1) of the trn, 64-bit half col >> 2 */
                            const uint32x4_t lo = u[col & 1].val[(col >> 1) & 1], hi = u[2 + (col & 1)].val[(col >> 1) & 1];
                            const uint32x4_t v = (col >> 2) ? vcombine_u32(vget_high_u32(lo), vget_high_u32(hi))
                                                            : vcombine_u32(vget_low_u32(lo), vget_low_u32(hi));
                            vst1q_u16(out + (size_t)(t0 + tt + col) * stride + c0 + cc, vreinterpretq_u16_u32(v));
                        }
                    }
#endif
            for (; tt < nt; tt++) {
                uint16_t *o = out + (size_t)(t0 + tt) * stride + c0;
                for (int cc = 0; cc < nc; cc++) o[cc] = tile[cc][tt];
            }
        }
    }
}

#if VW > 1
/* prog_mag.h's merge, 8 coefficients per step: the zero lanes of 8 magnitudes make an 8-bit mask;
 * its complement's table row expands the next popcount lowv values into the significant lanes,
 * its own row the next newv values into the others (one byte shuffle each: SSSE3 pshufb, NEON
 * tbl); insignificant lanes hold 0, so the result is (q << m) | low | new; the lanes whose new
 * index is nonzero take the next sign bytes the same way. */
static int64_t SFX(merge16)(int16_t *mag, uint8_t *neg, int64_t len, int m, const int16_t *lowv, int64_t *li,
                            int64_t lcap, const int16_t *newv, int64_t *ki, int64_t kcap, const uint8_t *sv,
                            int64_t *si, int64_t scap)
{
    int64_t j = 0, l = *li, k = *ki, s = *si;
#if defined(SKN_PATH_NEON)
    static const uint8_t bitw[8] = {1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x8_t bw = vld1_u8(bitw);
    const int16x8_t sh = vdupq_n_s16((int16_t)m);
    for (; j + 8 <= len && l + 8 <= lcap && k + 8 <= kcap && s + 8 <= scap; j += 8) {
        const int16x8_t q = vld1q_s16(mag + j);
        const unsigned zm = vaddv_u8(vand_u8(vmovn_u16(vceqzq_s16(q)), bw));
        const unsigned sm = zm ^ 0xffu;
        const int16x8_t lo = vreinterpretq_s16_u8(vqtbl1q_u8(vld1q_u8((const uint8_t *)(lowv + l)), vld1q_u8(SKN_EXPAND16[sm])));
        const int16x8_t nv = vreinterpretq_s16_u8(vqtbl1q_u8(vld1q_u8((const uint8_t *)(newv + k)), vld1q_u8(SKN_EXPAND16[zm])));
        vst1q_s16(mag + j, vorrq_s16(vorrq_s16(vshlq_s16(q, sh), lo), nv));
        const unsigned bm = vaddv_u8(vand_u8(vmovn_u16(vtstq_s16(nv, nv)), bw));
        const uint8x8_t sg = vqtbl1_u8(vcombine_u8(vld1_u8(sv + s), vdup_n_u8(0)), vld1_u8(SKN_EXPAND8[bm]));
        vst1_u8(neg + j, vorr_u8(vld1_u8(neg + j), sg));   /* (no branch on bm: it is data) */
        l += __builtin_popcount(sm);
        k += __builtin_popcount(zm);
        s += __builtin_popcount(bm);
    }
#else
    const __m128i zero = _mm_setzero_si128(), cnt = _mm_cvtsi32_si128(m);
    for (; j + 8 <= len && l + 8 <= lcap && k + 8 <= kcap && s + 8 <= scap; j += 8) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(mag + j));
        const unsigned zm = (unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm_cmpeq_epi16(q, zero), zero));
        const unsigned sm = zm ^ 0xffu;
        const __m128i lo = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(lowv + l)),
                                            _mm_load_si128((const __m128i *)SKN_EXPAND16[sm]));
        const __m128i nv = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(newv + k)),
                                            _mm_load_si128((const __m128i *)SKN_EXPAND16[zm]));
        _mm_storeu_si128((__m128i *)(mag + j), _mm_or_si128(_mm_or_si128(_mm_sll_epi16(q, cnt), lo), nv));
        const unsigned bm = (unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm_cmpgt_epi16(nv, zero), zero));
        const __m128i sg = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(sv + s)),
                                            _mm_load_si128((const __m128i *)SKN_EXPAND8[bm]));
        _mm_storel_epi64((__m128i *)(neg + j), _mm_or_si128(_mm_loadl_epi64((const __m128i *)(neg + j)), sg));
        /* (no branch on bm: it is data) */
        l += __builtin_popcount(sm);
        k += __builtin_popcount(zm);
        s += __builtin_popcount(bm);
    }
#endif
    *li = l;
    *ki = k;
    *si = s;
    return j;
}
#define MERGE16 SFX(merge16)
#else
#define MERGE16 NULL
#endif

const skn_kernels SFX(skn_kernels) = {PATH_NAME, SFX(idct2_f16), SFX(cachegen_f16), SFX(to_f16), MERGE16};
