/* CacheGen (wire-format 4.7; sakura.codec.cachegen, native engine) and lossless (4.4). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "skn_internal.h"

int skn_cachegen_f16(int32_t tokens, int32_t channels, int32_t bins, const float *amax, const uint32_t *hist,
                     const uint8_t *words, size_t n_words, const uint8_t *counts, size_t n_pieces, uint16_t *out)
{
    if (!amax || !hist || (!words && n_words) || (!counts && n_pieces) || !out) return SKN_E_ARG;
    if (tokens < 1 || channels < 1 || bins < 4 || bins > 256) return SKN_E_HEADER;
    if ((uint64_t)tokens * (uint64_t)channels > SKN_DEFAULT_MAX_VALUES) return SKN_E_LIMIT;
    for (int32_t t = 0; t < tokens; t++)
        if (!isfinite(amax[t]) || fabsf(amax[t]) > 65504.0f) return SKN_E_NONFINITE;
    const int32_t mx = bins / 2 - 1;
    skn_model m;
    int rc = skn_model_from_counts(&m, hist, (uint32_t)channels, (uint32_t)bins - 1);
    if (rc) return rc;
    const int64_t n = (int64_t)tokens * channels;
    const int64_t piece = (int64_t)tokens * ((1 << 16) / tokens > 1 ? (1 << 16) / tokens : 1);
    /* Piece by piece: a piece holds whole channels (piece is a multiple of T) and is a stream of its
     * own, so groups of pieces of >= 64 channels are decoded into a small buffer (<= 512 KiB, in
     * L2) and dequantised into the output straight away: no (C, T) symbol array of the whole part
     * (25 MB of fresh pages per Klein part at 4,096 tokens, written and read back once), and each
     * token row gets >= 128 bytes per write. */
    const int32_t piece_ch = (int32_t)(piece / tokens);
    const int32_t group_ch = piece_ch >= 64 ? piece_ch : piece_ch * ((64 + piece_ch - 1) / piece_ch);
    const int64_t pieces = (n + piece - 1) / piece;
    int32_t *ctx = malloc((size_t)channels * sizeof *ctx);
    int64_t *len = malloc((size_t)channels * sizeof *len);
    uint16_t *sym = malloc((size_t)tokens * (size_t)(group_ch < channels ? group_ch : channels) * sizeof *sym);
    skn_hint_huge(out, (size_t)n * 2);
    float *scale = malloc((size_t)tokens * sizeof *scale);
    if (!ctx || !len || !sym || !scale) { rc = SKN_E_NOMEM; goto out; }
    /* the stream's layout as a whole (as skn_rans_run checks it), before any piece is decoded */
    if ((int64_t)n_pieces != pieces) { rc = SKN_E_RANS_LAYOUT; goto out; }
    uint64_t wsum = 0;
    for (int64_t i = 0; i < pieces; i++) {
        wsum += skn_rd32(counts + 4 * i);
        if (wsum > n_words) { rc = SKN_E_RANS_LAYOUT; goto out; }
    }
    if (wsum != n_words) { rc = SKN_E_RANS_LAYOUT; goto out; }
    for (int32_t c = 0; c < channels; c++) { ctx[c] = c; len[c] = tokens; }
    for (int32_t t = 0; t < tokens; t++) scale[t] = amax[t] / (float)mx;
    const skn_kernels *k = skn_kernels_get();
    uint64_t woff = 0;
    for (int32_t c0 = 0; c0 < channels; c0 += group_ch) {
        const int32_t nch = channels - c0 < group_ch ? channels - c0 : group_ch;
        const int64_t p0 = (int64_t)c0 / piece_ch, p1 = ((int64_t)c0 + nch + piece_ch - 1) / piece_ch;
        uint64_t nw = 0;
        for (int64_t i = p0; i < p1; i++) nw += skn_rd32(counts + 4 * i);
        skn_stream st = {words + 2 * woff, (size_t)nw, counts + 4 * p0, (size_t)(p1 - p0), n};
        if ((rc = skn_rans_run(&st, ctx + c0, len + c0, (size_t)nch, &m, piece, sym, (int64_t)nch * tokens))) goto out;
        k->cachegen_f16(sym, scale, mx, tokens, nch, channels, out + c0);
        woff += nw;
    }
out:
    free(ctx);
    free(len);
    free(sym);
    free(scale);
    skn_model_free(&m);
    return rc;
}

int skn_lossless_f16(const uint8_t *planes, size_t n, int32_t byte_planes, uint16_t *out)
{
    if ((!planes || !out) && n) return SKN_E_ARG;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const uint16_t v = byte_planes ? (uint16_t)(planes[i] | (planes[n + i] << 8)) : skn_rd16(planes + 2 * i);
        out[i] = v;
        bad |= (v & 0x7c00) == 0x7c00;
    }
    return bad ? SKN_E_NONFINITE : SKN_OK;
}
