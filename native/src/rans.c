/* The interleaved rANS decoder (wire-format 4.6; sakura.codec.rans._decode_pieces in numba).
 * 8 lanes for streams of >= 1,024 symbols (1 below), a slot -> symbol table per context row
 * (built when the row changes), renormalisation without a branch in the 8-lane body. Every word
 * read is bounds-checked or proven in bounds (>= 8 words left before a block of 8 steps). */
#include <stdlib.h>
#include <string.h>

#include "skn_internal.h"

#define LANES_BIG 8
#define BIG_STREAM 1024

typedef struct {
    const uint8_t *w;   /* words, little-endian u16 */
    int64_t p, pend;
} cursor;

/* row c's slot -> symbol table, and its (freq, cum) pairs side by side (fc[s] = freq | cum << 32:
   one load per step where two arrays took two) */
static void build_slots8(const skn_model *m, uint32_t c, uint8_t *tab, uint64_t *fc)
{
    const uint32_t *f = m->freq + (size_t)c * m->A, *cm = m->cum + (size_t)c * (m->A + 1);
    for (uint32_t s = 0; s < m->A; s++) {
        memset(tab + cm[s], (int)s, f[s]);
        fc[s] = f[s] | (uint64_t)cm[s] << 32;
    }
}

static void build_slots16(const skn_model *m, uint32_t c, uint16_t *tab, uint64_t *fc)
{
    const uint32_t *f = m->freq + (size_t)c * m->A, *cm = m->cum + (size_t)c * (m->A + 1);
    for (uint32_t s = 0; s < m->A; s++) {
        for (uint32_t k = 0; k < f[s]; k++) tab[cm[s] + k] = (uint16_t)s;
        fc[s] = f[s] | (uint64_t)cm[s] << 32;
    }
}

/* the piece decoder, once per slot-table type (no type test per symbol) */
#define WORKER decode_pieces_8
#define TABT uint8_t
#define BUILD build_slots8
#include "rans_worker.h"
#undef WORKER
#undef TABT
#undef BUILD
#define WORKER decode_pieces_16
#define TABT uint16_t
#define BUILD build_slots16
#include "rans_worker.h"
#undef WORKER
#undef TABT
#undef BUILD

int skn_rans_run(const skn_stream *st, const int32_t *seg_ctx, const int64_t *seg_len, size_t n_seg,
                 const skn_model *m, int64_t piece, uint16_t *out, int64_t n)
{
    if (n < 0 || piece <= 0) return SKN_E_ARG;
    const int64_t pieces = n ? (n + piece - 1) / piece : 0;
    if ((int64_t)st->n_pieces != pieces) return SKN_E_RANS_LAYOUT;
    if (n == 0) return st->n_words == 0 ? SKN_OK : SKN_E_RANS_LAYOUT;
    /* the segments: contexts inside the table, lengths adding up to n */
    int64_t tot = 0;
    for (size_t i = 0; i < n_seg; i++) {
        if (seg_ctx[i] < 0 || (uint32_t)seg_ctx[i] >= m->rows || seg_len[i] < 0) return SKN_E_RANS_LAYOUT;
        tot += seg_len[i];
        if (tot > n) return SKN_E_RANS_LAYOUT;
    }
    if (tot != n) return SKN_E_RANS_LAYOUT;
    /* piece word counts add up to the words */
    uint64_t wsum = 0;
    for (int64_t i = 0; i < pieces; i++) {
        wsum += skn_rd32(st->counts + 4 * i);
        if (wsum > st->n_words) return SKN_E_RANS_LAYOUT;
    }
    if (wsum != st->n_words) return SKN_E_RANS_LAYOUT;
    int rc;
    uint64_t *fc = malloc((size_t)m->A * sizeof *fc);
    if (!fc) return SKN_E_NOMEM;
    if (m->A <= 256) {   /* a byte slot table (alphabets up to 256): half the fill, L1-resident */
        uint8_t *tab = malloc((size_t)1 << m->bits);
        rc = tab ? decode_pieces_8(st, seg_ctx, seg_len, n_seg, m, piece, out, n, tab, fc) : SKN_E_NOMEM;
        free(tab);
    } else {
        uint16_t *tab = malloc(((size_t)1 << m->bits) * sizeof *tab);
        rc = tab ? decode_pieces_16(st, seg_ctx, seg_len, n_seg, m, piece, out, n, tab, fc) : SKN_E_NOMEM;
        free(tab);
    }
    free(fc);
    return rc;
}

int skn_rans_decode(const uint8_t *words, size_t n_words, const uint8_t *counts, size_t n_pieces,
                    const int32_t *seg_ctx, const int64_t *seg_len, size_t n_seg, const double *weights,
                    uint32_t rows, uint32_t alphabet, int64_t piece, int32_t *out, int64_t n)
{
    if ((!words && n_words) || (!counts && n_pieces) || (!seg_ctx && n_seg) || (!seg_len && n_seg) || !weights ||
        (!out && n) || n < 0 || (n > 0 && n_seg == 0))
        return SKN_E_ARG;
    double *w = malloc((size_t)rows * alphabet * sizeof *w + 1);
    if (!w) return SKN_E_NOMEM;
    for (size_t i = 0; i < (size_t)rows * alphabet; i++) w[i] = weights[i] + 1.0;
    skn_model m;
    int rc = skn_model_build(&m, w, rows, alphabet);
    free(w);
    if (rc) return rc;
    uint16_t *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!tmp) { skn_model_free(&m); return SKN_E_NOMEM; }
    skn_stream st = {words, n_words, counts, n_pieces, 0};
    rc = skn_rans_run(&st, seg_ctx, seg_len, n_seg, &m, piece, tmp, n);
    if (rc == SKN_OK)
        for (int64_t i = 0; i < n; i++) out[i] = tmp[i];
    free(tmp);
    skn_model_free(&m);
    return rc;
}
