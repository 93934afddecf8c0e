/* Internal declarations of libsakura_decode (not installed). */
#ifndef SKN_INTERNAL_H
#define SKN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "../include/sakura_decode.h"

#if defined(__GNUC__) || defined(__clang__)
#define SKN_INLINE inline __attribute__((always_inline))
#else
#define SKN_INLINE inline
#endif

#define SKN_RANS_L (1u << 16)
#define SKN_PIECE (1 << 16)
#define SKN_MAX_ALPHABET (1 << 15)
#define SKN_DEFAULT_MAX_VALUES ((uint64_t)1 << 28)

static SKN_INLINE uint16_t skn_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static SKN_INLINE uint32_t skn_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* A quantised static model: freq/cum (rows, A) / (rows, A + 1). */
typedef struct skn_model {
    uint32_t rows, A, bits;
    uint32_t *freq;
    uint32_t *cum;
} skn_model;

/* weights (rows, A) > 0 (smoothing already added) -> model; numpy's arithmetic exactly. */
int skn_model_build(skn_model *m, const double *weights, uint32_t rows, uint32_t A);
/* from a u8 log-count table (wire-format 4.8) */
int skn_model_from_logcounts(skn_model *m, const uint8_t *t, uint32_t rows, uint32_t A);
/* from u32 counts (+1 smoothing) */
int skn_model_from_counts(skn_model *m, const uint32_t *c, uint32_t rows, uint32_t A);
void skn_model_free(skn_model *m);

/* Decode a stream whose words/counts are raw little-endian bytes. Symbols -> out (uint16). */
typedef struct skn_stream {
    const uint8_t *words; size_t n_words;
    const uint8_t *counts; size_t n_pieces;
    int64_t whole;   /* symbols of the whole stream when this is a run of its pieces (0: n), which
                        sets the lane count (a property of the stream, not of the run) */
} skn_stream;

int skn_rans_run(const skn_stream *st, const int32_t *seg_ctx, const int64_t *seg_len, size_t n_seg,
                 const skn_model *m, int64_t piece, uint16_t *out, int64_t n);

/* The per-path kernels (kern.c compiled once per vector path). */
typedef struct skn_kernels {
    const char *name;
    /* fused reconstruction + 2-D inverse DCT + scale + mean + fp16 for channel blocks [lo, hi) */
    int (*idct2_f16)(int n, int mag32, const void *mag, const uint8_t *neg, const int32_t *perm, float step,
                     float off, int32_t lo, int32_t hi, const float *inv, const float *mu, int32_t C,
                     uint16_t *out, float *scratch);
    /* CacheGen: (nc, T) channel-major symbols -> (T, nc) fp16 of (s - mx) * scale[t], output rows
       `stride` values apart */
    void (*cachegen_f16)(const uint16_t *sym, const float *scale, int32_t mx, int32_t T, int32_t nc,
                         int32_t stride, uint16_t *out);
    /* n float32 -> fp16 bits (round to nearest even) */
    void (*to_f16)(const float *x, size_t n, uint16_t *out);
    /* The refinement merge (prog_mag.h's `refine`, int16 magnitudes), 8 coefficients per step from
     * the band's start while each scratch array has a whole vector left (cursor + 8 <= its
     * capacity; sv: + 8): mag[j] = (mag[j] << m) | lowv[li++] where mag[j] != 0, else newv[ki++],
     * and neg[j] |= sv[si++] where that new index is nonzero. Advances the cursors and returns the
     * coefficients done (a multiple of 8, <= len); NULL on the scalar path. */
    int64_t (*merge16)(int16_t *mag, uint8_t *neg, int64_t len, int m, const int16_t *lowv, int64_t *li,
                       int64_t lcap, const int16_t *newv, int64_t *ki, int64_t kcap, const uint8_t *sv, int64_t *si,
                       int64_t scap);
} skn_kernels;

const skn_kernels *skn_kernels_get(void);

/* Large buffers (T x C arrays) in 2 MiB-aligned memory that Linux backs with transparent huge pages
 * (madvise): the inverse DCT reads and writes them a cache line per token row, C values apart, so
 * with 4 KiB pages nearly every row is a TLB miss, and a fresh buffer takes a page fault per 4 KiB.
 * Elsewhere plain malloc. Freed with free(). */
void *skn_big_alloc(size_t n);
/* The same hint for a caller's output buffer (only the 2 MiB pages wholly inside [p, p + n); a hint,
 * ignored where it does not apply, e.g. memory already touched or not anonymous). */
void skn_hint_huge(void *p, size_t n);
int skn_block_channels(int n);
int skn_row_stride(int n);

#endif
