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
    int32_t *ctx = malloc((size_t)channels * sizeof *ctx);
    int64_t *len = malloc((size_t)channels * sizeof *len);
    uint16_t *sym = skn_big_alloc((size_t)n * sizeof *sym);
    skn_hint_huge(out, (size_t)n * 2);
    float *scale = malloc((size_t)tokens * sizeof *scale);
    if (!ctx || !len || !sym || !scale) { rc = SKN_E_NOMEM; goto out; }
    for (int32_t c = 0; c < channels; c++) { ctx[c] = c; len[c] = tokens; }
    skn_stream st = {words, n_words, counts, n_pieces};
    if ((rc = skn_rans_run(&st, ctx, len, (size_t)channels, &m, piece, sym, n))) goto out;
    for (int32_t t = 0; t < tokens; t++) scale[t] = amax[t] / (float)mx;
    skn_kernels_get()->cachegen_f16(sym, scale, mx, tokens, channels, out);
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
