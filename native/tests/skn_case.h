/* The test-vector case format (one decode and its expected output, written by
 * `python -m sakura.bench.wirevectors --native-cases DIR`) and its decoder: used by the vector
 * runner (skn_vectors.c) and by the fuzz target (fuzz/skn_fuzz.c), so the fuzzer drives the
 * library's entry points with everything a case can say: header numbers, tables, payload bytes.
 *
 * All little-endian:  "SKNC" u32 kind (1 progressive, 2 cachegen, 3 lossless) u8[32] sha256 of
 * the expected K then V fp16 bytes, then per kind:
 *   progressive: i32 T H D levels; per part: f64 step, i32 m0 grid mean_f32 scaled has_off,
 *                i32 planes[16], f64 off[16]; u32 has_tables; if set, per part: u32 has_mean,
 *                f32 mean[C] if set, then 17 tables (u32 rows, u32 cols, rows x cols bytes);
 *                u32 rungs; per rung: u32 n_own, i32 own[n_own], u32 n, n payload bytes
 *   cachegen:    i32 T C; per part: i32 bins, f32 amax[T], u32 hist[C (bins - 1)],
 *                u32 n_words, 2 n_words bytes, u32 n_pieces, 4 n_pieces bytes
 *   lossless:    u32 n, i32 byte_planes; per part 2 n bytes
 * Every read is bounds-checked: a malformed case is SKN_E_ARG, never a crash. */
#ifndef SKN_CASE_H
#define SKN_CASE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../include/sakura_decode.h"

typedef struct { const uint8_t *p; size_t n, at; int bad; } rd_t;

static const uint8_t *rd_bytes(rd_t *r, size_t k)
{
    if (r->bad || k > r->n - r->at) { r->bad = 1; return NULL; }
    const uint8_t *q = r->p + r->at;
    r->at += k;
    return q;
}
static uint32_t rd_u32(rd_t *r)
{
    const uint8_t *q = rd_bytes(r, 4);
    return q ? (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24) : 0;
}
static int32_t rd_i32(rd_t *r) { return (int32_t)rd_u32(r); }
static double rd_f64(rd_t *r)
{
    const uint8_t *q = rd_bytes(r, 8);
    uint64_t u = 0;
    if (q) for (int i = 7; i >= 0; i--) u = (u << 8) | q[i];
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* copy k little-endian 4-byte values into a fresh aligned buffer (NULL on failure) */
static void *rd_copy4(rd_t *r, size_t count)
{
    if (count > (r->n - r->at) / 4) { r->bad = 1; return NULL; }
    const uint8_t *q = rd_bytes(r, count * 4);
    uint32_t *out = malloc(count ? count * 4 : 4);
    if (!q || !out) { free(out); r->bad = 1; return NULL; }
    for (size_t i = 0; i < count; i++)
        out[i] = (uint32_t)q[4 * i] | ((uint32_t)q[4 * i + 1] << 8) | ((uint32_t)q[4 * i + 2] << 16) |
                 ((uint32_t)q[4 * i + 3] << 24);
    return out;
}

#ifndef CASE_MAX_VALUES
#define CASE_MAX_VALUES ((uint64_t)1 << 24)   /* the runner's cap on T x C (the fuzzer sets its own) */
#endif

/* Decode one case: K then V fp16 into *out (malloc'd, *n_out values each part x 2). Returns the
 * library's status, or SKN_E_ARG for a malformed case. */
static int skn_case_run(const uint8_t *data, size_t size, uint32_t *kind, uint8_t sha[32], uint16_t **out,
                        size_t *n_out)
{
    rd_t r = {data, size, 0, 0};
    *out = NULL;
    *n_out = 0;
    const uint8_t *magic = rd_bytes(&r, 4);
    if (!magic || memcmp(magic, "SKNC", 4)) return SKN_E_ARG;
    *kind = rd_u32(&r);
    const uint8_t *sh = rd_bytes(&r, 32);
    if (!sh) return SKN_E_ARG;
    memcpy(sha, sh, 32);
    int rc = SKN_E_ARG;
    if (*kind == 1) {
        skn_prog_header h;
        memset(&h, 0, sizeof h);
        h.tokens = rd_i32(&r); h.heads = rd_i32(&r); h.head_dim = rd_i32(&r); h.levels = rd_i32(&r);
        h.max_values = CASE_MAX_VALUES;
        for (int i = 0; i < 2; i++) {
            skn_prog_part *p = &h.part[i];
            p->step = rd_f64(&r); p->m0 = rd_i32(&r); p->grid = rd_i32(&r); p->mean_f32 = rd_i32(&r);
            p->scaled = rd_i32(&r); p->has_off = rd_i32(&r);
            for (int l = 0; l < SKN_MAX_LEVELS; l++) p->planes[l] = rd_i32(&r);
            for (int l = 0; l < SKN_MAX_LEVELS; l++) p->off[l] = rd_f64(&r);
        }
        if (r.bad) return SKN_E_ARG;
        skn_prog *s = NULL;
        if ((rc = skn_prog_open(&s, &h))) return rc;
        const size_t C = (size_t)h.heads * (size_t)h.head_dim, TC = (size_t)h.tokens * C;
        skn_prog_tables tab;
        memset(&tab, 0, sizeof tab);
        float *means[2] = {NULL, NULL};
        const uint32_t has_tables = rd_u32(&r);
        for (int i = 0; has_tables && i < 2 && !r.bad; i++) {
            if (rd_u32(&r)) { means[i] = rd_copy4(&r, C); tab.mean[i] = means[i]; }
            for (int t = 0; t <= SKN_MAX_LEVELS && !r.bad; t++) {
                const uint32_t rows = rd_u32(&r), cols = rd_u32(&r);
                if ((uint64_t)rows * cols > r.n - r.at) { r.bad = 1; break; }
                tab.hist[i][t].rows = rows;
                tab.hist[i][t].cols = cols;
                tab.hist[i][t].data = rd_bytes(&r, (size_t)rows * cols);
            }
        }
        const uint32_t rungs = r.bad ? 0 : rd_u32(&r);
        rc = r.bad ? SKN_E_ARG : SKN_OK;
        for (uint32_t l = 0; l < rungs && rc == SKN_OK; l++) {
            const uint32_t n_own = rd_u32(&r);
            if (n_own > 8) { rc = SKN_E_ARG; break; }
            int32_t own[8];
            for (uint32_t j = 0; j < n_own; j++) own[j] = rd_i32(&r);
            const uint32_t n = rd_u32(&r);
            const uint8_t *pl = rd_bytes(&r, n);
            if (r.bad) { rc = SKN_E_ARG; break; }
            const skn_prog_tables *tp = has_tables ? &tab : NULL;
            rc = l == 0 ? skn_prog_start(s, pl, n, own, n_own, tp) : skn_prog_upgrade(s, (int32_t)l, pl, n, own, n_own, tp);
        }
        if (rc == SKN_OK) {
            *out = malloc(2 * TC * sizeof **out);
            if (!*out) rc = SKN_E_NOMEM;
            else if ((rc = skn_prog_result_f16(s, *out, *out + TC)) == SKN_OK) *n_out = 2 * TC;
        }
        skn_prog_free(s);
        free(means[0]);
        free(means[1]);
    } else if (*kind == 2) {
        const int32_t T = rd_i32(&r), C = rd_i32(&r);
        if (r.bad || T < 1 || C < 1 || (uint64_t)T * (uint64_t)C > CASE_MAX_VALUES) return SKN_E_ARG;
        const size_t TC = (size_t)T * (size_t)C;
        *out = malloc(2 * TC * sizeof **out);
        if (!*out) return SKN_E_NOMEM;
        rc = SKN_OK;
        for (int i = 0; i < 2 && rc == SKN_OK; i++) {
            const int32_t bins = rd_i32(&r);
            if (r.bad || bins < 4 || bins > 256) { rc = SKN_E_ARG; break; }
            float *amax = rd_copy4(&r, (size_t)T);
            uint32_t *hist = rd_copy4(&r, (size_t)C * (size_t)(bins - 1));
            const uint32_t nw = rd_u32(&r);
            const uint8_t *w = rd_bytes(&r, (size_t)nw * 2);
            const uint32_t np = rd_u32(&r);
            const uint8_t *pc = rd_bytes(&r, (size_t)np * 4);
            if (r.bad) rc = SKN_E_ARG;
            else rc = skn_cachegen_f16(T, C, bins, amax, hist, w, nw, pc, np, *out + i * TC);
            free(amax);
            free(hist);
        }
        if (rc == SKN_OK) *n_out = 2 * TC;
    } else if (*kind == 3) {
        const uint32_t n = rd_u32(&r);
        const int32_t planes = rd_i32(&r);
        if (r.bad || n > CASE_MAX_VALUES) return SKN_E_ARG;
        *out = malloc(2 * (size_t)(n ? n : 1) * sizeof **out);
        if (!*out) return SKN_E_NOMEM;
        rc = SKN_OK;
        for (int i = 0; i < 2 && rc == SKN_OK; i++) {
            const uint8_t *b = rd_bytes(&r, 2 * (size_t)n);
            rc = r.bad ? SKN_E_ARG : skn_lossless_f16(b, n, planes, *out + (size_t)i * n);
        }
        if (rc == SKN_OK) *n_out = 2 * (size_t)n;
    }
    if (rc != SKN_OK) { free(*out); *out = NULL; *n_out = 0; }
    return rc;
}

#endif
