/* sakura_decode.h: the phone's KV decoder as a C11 library (libsakura_decode).
 *
 * Decodes the payloads of sakura's wire format (docs/wire-format.md, section 4) into fp16 K/V:
 * progressive ladders (rung 0 and every refinement, versions 4 and 5, small and big layouts),
 * CacheGen (levels 1-3, versions 4 and 5) and lossless. Bit-exact with the Python package's numba
 * decoder (the reference); the test vectors' SHA-256 digests check it.
 *
 * What the caller does and what the library does. The container (the 24-byte fixed header, its
 * crc32, the JSON header, zstd-compressed sections) is the app's: it has a JSON parser and zstd
 * already, and the library stays free of both. Everything after it is the library's: every byte of
 * a progressive payload (its chunk table, histograms, rANS streams, bit planes), CacheGen's streams
 * and histograms, the numbers of the header (checked here again: a forged header cannot make the
 * library read or write out of bounds). All integers in payload bytes are read little-endian byte
 * by byte (no alignment needed, any host byte order).
 *
 * Rules: no allocation is sized from a payload field; buffers are sized from the header's shape
 * (T x H x D, at most `max_values` per part, 2^28 by default). No abort, no exit, no global state
 * but the chosen vector path. Every function returns SKN_OK (0) or a negative skn_status.
 * Thread safety: distinct skn_prog objects may be used from distinct threads at once.
 */
#ifndef SAKURA_DECODE_H
#define SAKURA_DECODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SKN_API __declspec(dllexport)
#else
#define SKN_API __attribute__((visibility("default")))
#endif

#define SKN_ABI_VERSION 1

typedef enum skn_status {
    SKN_OK = 0,
    SKN_E_ARG = -1,          /* a NULL pointer or a size the call cannot take */
    SKN_E_NOMEM = -2,        /* an allocation failed */
    SKN_E_HEADER = -3,       /* a header number out of range (step, m0, planes, grid, bins, shape) */
    SKN_E_PAYLOAD = -4,      /* payload bytes malformed: chunk table, a chunk's size, flags, bit planes */
    SKN_E_RANS_WORDS = -5,   /* a rANS piece needs more words than it has */
    SKN_E_RANS_STATE = -6,   /* a rANS piece ends in a wrong state (wrong tables or corrupt data) */
    SKN_E_RANS_LEFTOVER = -7,/* a rANS piece leaves words unread */
    SKN_E_RANS_LAYOUT = -8,  /* a stream's piece table does not fit its symbols and words */
    SKN_E_COVER = -9,        /* decoded symbols do not cover the coded bands exactly */
    SKN_E_TABLE = -10,       /* a table (histogram, mean) missing or of the wrong shape */
    SKN_E_NONFINITE = -11,   /* the decoded values (or a mean / scale) are not finite */
    SKN_E_ORDER = -12,       /* a call out of order (a refinement before rung 0, a level skipped) */
    SKN_E_UNSUPPORTED = -13, /* valid but not decoded here (a non-power-of-two DCT grid) */
    SKN_E_LIMIT = -14        /* the shape is over max_values */
} skn_status;

/* A one-line English description of a status (static storage). */
SKN_API const char *skn_strerror(int status);
/* "1.0.0": the library's version. */
SKN_API const char *skn_version(void);

/* The vector path in use: "scalar", "sse4" (x86-64-v2, 128-bit), "avx2" (256-bit + F16C) or
 * "neon" (aarch64). Chosen at the first call from what the CPU has (the best one), or by
 * skn_set_path. */
SKN_API const char *skn_path_name(void);
/* Use path `name` (one of the above; NULL or "auto" = the best this CPU runs). SKN_E_UNSUPPORTED
 * if this build or this CPU lacks it. Call it before decoding starts (not thread safe). */
SKN_API int skn_set_path(const char *name);
/* The paths this build holds and this CPU runs, comma-separated, best last (static storage). */
SKN_API const char *skn_paths_available(void);

/* ------------------------------------------------------------------------------------------
 * Progressive ladders (wire-format 4.8). One skn_prog per shard: open with the base header's
 * numbers, feed rung 0's payload, then each refinement's, then read the fp16 K and V. */

#define SKN_MAX_LEVELS 16

typedef struct skn_prog_part {
    double step;                     /* prog[kv]["step"] (> 0, finite) */
    int32_t m0;                      /* prog[kv]["m0"], 1..16383 */
    int32_t grid;                    /* prog[kv]["grid"]: n with n x n = T, or 0 */
    int32_t mean_f32;                /* 1 if prog[kv]["mean"] is "<f4", 0 for "<f2" */
    int32_t scaled;                  /* prog[kv]["scaled"] */
    int32_t planes[SKN_MAX_LEVELS];  /* prog[kv]["planes"], `levels` entries */
    double off[SKN_MAX_LEVELS];      /* prog[kv]["off"] (version 5), ignored when has_off is 0 */
    int32_t has_off;                 /* 1 in version-5 objects, 0 in version 4 (offsets 1/2) */
} skn_prog_part;

typedef struct skn_prog_header {
    int32_t tokens, heads, head_dim; /* header "shape": T, H, D (C = H x D channels) */
    int32_t levels;                  /* header "levels", 1..SKN_MAX_LEVELS */
    skn_prog_part part[2];           /* prog["k"], prog["v"] */
    uint64_t max_values;             /* cap on T x H x D (0: 2^28, the format's limit) */
} skn_prog_header;

/* One (rows x cols) uint8 table (a histogram) or float32 array (a mean), row-major. */
typedef struct skn_u8_table { const uint8_t *data; uint32_t rows, cols; } skn_u8_table;

/* The template's shared tables for this shard's layer (an object whose header has "tables"),
 * or NULL for a self-contained object. hist[i][0] = "L{layer}.{kv}.e0q" (big layouts only),
 * hist[i][1] = "e0", hist[i][l] for l >= 2 = "e{l-1}"... see skn_prog_hist_index. */
typedef struct skn_prog_tables {
    const float *mean[2];            /* "L{layer}.{kv}.mean" as float32 (C values), kv = k, v */
    skn_u8_table hist[2][SKN_MAX_LEVELS + 1]; /* [kv][slot]: slot 0 = e0q, 1 = e0, 1 + l = e{l} */
} skn_prog_tables;

typedef struct skn_prog skn_prog;

/* Check the header's numbers and allocate a decoder (magnitudes and signs: 3 x T x C bytes per
 * part at most). *out is NULL on failure. */
SKN_API int skn_prog_open(skn_prog **out, const skn_prog_header *h);
/* Rung 0: the base object's section "p" (`payload`, n bytes) and its header "own" (one 0/1 per
 * part). tables: NULL, or the layer's shared tables (used where own[i] is 0). */
SKN_API int skn_prog_start(skn_prog *s, const uint8_t *payload, size_t n, const int32_t *own, size_t n_own,
                           const skn_prog_tables *tables);
/* Rung `level` (= the current rung + 1): a refinement object's section "p" and its "own" (one
 * entry per part whose planes grow at this rung). The state is unchanged on failure only for
 * errors found before the first coefficient changes; after an error, free the decoder. */
SKN_API int skn_prog_upgrade(skn_prog *s, int32_t level, const uint8_t *payload, size_t n, const int32_t *own,
                             size_t n_own, const skn_prog_tables *tables);
/* Reuse a decoder for another shard of the same shape (T, H x D, grid, magnitude width): its
 * buffers stay allocated (a fresh decoder's are fresh pages, ~10 % of a 4,096-token decode).
 * SKN_E_ARG if the shapes differ (open another one); the decoder then stands before rung 0. */
SKN_API int skn_prog_reset(skn_prog *s, const skn_prog_header *h);
/* The current rung (-1 before skn_prog_start). */
SKN_API int32_t skn_prog_level(const skn_prog *s);
/* K and V at the current rung as fp16 bit patterns, each (T, H x D) row-major (T x H x D values).
 * (skn_prog_open refuses grids without a fast inverse DCT, n not a power of two up to 64, with
 * SKN_E_UNSUPPORTED: the numba decoder handles those.) */
SKN_API int skn_prog_result_f16(skn_prog *s, uint16_t *key, uint16_t *value);
/* The same in pieces, so that threads can share one shard: the output of part `part` (0 = K,
 * 1 = V) is made of skn_prog_blocks(s) channel blocks (1 without a transform), and
 * skn_prog_result_part_f16 writes blocks [lo, hi) of it into `out` (T, H x D); distinct blocks
 * may be written from distinct threads at once. Then skn_prog_check_f16 on the whole K and V
 * (SKN_E_NONFINITE where a forged header makes values overflow). */
SKN_API int32_t skn_prog_blocks(const skn_prog *s);
SKN_API int skn_prog_result_part_f16(skn_prog *s, int32_t part, int32_t lo, int32_t hi, uint16_t *out);
SKN_API int skn_prog_check_f16(const skn_prog *s, const uint16_t *key, const uint16_t *value);
SKN_API void skn_prog_free(skn_prog *s);

/* ------------------------------------------------------------------------------------------
 * CacheGen (wire-format 4.7), one part (K or V) of a non-delta object: `words` / `counts` the
 * sections rans.{kv} / pieces.{kv} as bytes (n_words x 2, n_pieces x 4 bytes), `hist` the
 * (C, bins - 1) uint32 counts (section hist.{kv} decompressed, or table L{layer}.{kv}.b{bins}),
 * amax (T,) float32 (the {kv}_amax section converted). out: (T, C) fp16 bits. */
SKN_API int skn_cachegen_f16(int32_t tokens, int32_t channels, int32_t bins, const float *amax,
                             const uint32_t *hist, const uint8_t *words, size_t n_words, const uint8_t *counts,
                             size_t n_pieces, uint16_t *out);

/* Lossless float16 (wire-format 4.4): `planes` the section (decompressed) as bytes; byte_planes
 * = 1 for the zstd layout (2 rows of n bytes: low bytes, then high bytes), 0 for plain <u2 values.
 * out: n fp16 bit patterns. SKN_E_NONFINITE if any is inf or NaN. */
SKN_API int skn_lossless_f16(const uint8_t *planes, size_t n, int32_t byte_planes, uint16_t *out);

/* ------------------------------------------------------------------------------------------
 * The rANS stream itself (wire-format 4.6), for tests and other codecs: n symbols in segments
 * (seg_ctx[i], seg_len[i]) coded with the model of a (rows, A) weight table `weights`
 * (float64, + 1 smoothing applied here as the spec says), pieces of `piece` symbols. */
SKN_API int skn_rans_decode(const uint8_t *words, size_t n_words, const uint8_t *counts, size_t n_pieces,
                            const int32_t *seg_ctx, const int64_t *seg_len, size_t n_seg, const double *weights,
                            uint32_t rows, uint32_t alphabet, int64_t piece, int32_t *out, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* SAKURA_DECODE_H */
