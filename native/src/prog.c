/* Progressive ladders (wire-format 4.8; sakura.codec.progressive.ProgressiveState, native engine).
 * Magnitudes and signs of both parts live in the skn_prog between rungs, in the band-sorted flat
 * (T x C) order; int16 magnitudes where every rung's fit (as numba's `magnitude_dtype`). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "skn_internal.h"
#include "gen_tables.h"

#define MAX_PLANES 12
#define QUAD_ESC 81
#define BIG_BAND 16384

struct skn_prog {
    skn_prog_header h;
    int32_t T, C, grid, nb, level;
    int64_t TC;
    int big;
    int32_t *perm;       /* (T,) band-sorted row r -> token-grid row perm[r] */
    int64_t *starts;     /* (nb + 1,) flat offsets of the bands */
    void *mag[2];
    int mag32[2];
    uint8_t *neg[2];
    int64_t *zeros[2];   /* (nb,) zero magnitudes per band */
    float *mean[2];      /* (C,) */
    float *inv[2];       /* (T,) token scales as float32, or NULL */
    double min_scale[2];
    double mean_absmax[2];
    /* the refinement's scratch (unpacked low bits, a band's new indices, sign bytes), kept from
       rung to rung and shard to shard (fresh pages cost a fault per 4 KiB) */
    int16_t *lowv, *newv;
    uint8_t *sv;
    size_t lowv_cap, newv_cap, sv_cap;
};

/* *buf holds at least n elements of `size` bytes (grown, contents not kept) */
static int scratch(void **buf, size_t *cap, size_t n, size_t size)
{
    if (*cap >= n) return SKN_OK;
    free(*buf);
    *buf = skn_big_alloc(n * size);
    *cap = *buf ? n : 0;
    return *buf ? SKN_OK : SKN_E_NOMEM;
}

/* ---- payload chunks (u32 count <= 64, u32 lengths, the chunks) ---- */
typedef struct {
    const uint8_t *b;
    uint32_t count, i;
    size_t at;
} chunks;

static int chunks_open(chunks *r, const uint8_t *b, size_t n)
{
    if (!b || n < 4) return SKN_E_PAYLOAD;
    const uint32_t cnt = skn_rd32(b);
    if (cnt > 64 || n < 4 + 4 * (size_t)cnt) return SKN_E_PAYLOAD;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < cnt; i++) sum += skn_rd32(b + 4 + 4 * i);
    if (sum != n - 4 - 4 * (uint64_t)cnt) return SKN_E_PAYLOAD;
    r->b = b; r->count = cnt; r->i = 0; r->at = 4 + 4 * (size_t)cnt;
    return SKN_OK;
}

static int chunk_next(chunks *r, const uint8_t **p, size_t *len)
{
    if (r->i >= r->count) return SKN_E_PAYLOAD;
    *len = skn_rd32(r->b + 4 + 4 * r->i);
    *p = r->b + r->at;
    r->at += *len;
    r->i++;
    return SKN_OK;
}

/* a chunk of exactly `want` bytes */
static int chunk_exact(chunks *r, const uint8_t **p, size_t want)
{
    size_t len;
    int rc = chunk_next(r, p, &len);
    if (rc) return rc;
    return len == want ? SKN_OK : SKN_E_PAYLOAD;
}

static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t f;
    if (e == 0) {
        if (m == 0) f = sign;
        else {   /* subnormal: m x 2^-24, exact in float32 */
            float v = (float)m * 0x1p-24f;
            memcpy(&f, &v, 4);
            f |= sign;
        }
    } else if (e == 31) f = sign | 0x7f800000u | (m << 13);
    else f = sign | ((e + 112) << 23) | (m << 13);
    float out;
    memcpy(&out, &f, 4);
    return out;
}

void skn_prog_free(skn_prog *s)
{
    if (!s) return;
    free(s->perm);
    free(s->starts);
    free(s->lowv);
    free(s->newv);
    free(s->sv);
    for (int i = 0; i < 2; i++) {
        free(s->mag[i]);
        free(s->neg[i]);
        free(s->zeros[i]);
        free(s->mean[i]);
        free(s->inv[i]);
    }
    free(s);
}

static int check_part(const skn_prog_header *h, const skn_prog_part *p)
{
    if (!(isfinite(p->step) && p->step > 0) || p->m0 < 1 || p->m0 > SKN_MAX_ALPHABET / 2 - 1) return SKN_E_HEADER;
    if (p->planes[0] != 0) return SKN_E_HEADER;
    for (int l = 1; l < h->levels; l++)
        if (p->planes[l] < p->planes[l - 1]) return SKN_E_HEADER;
    if (p->planes[h->levels - 1] > MAX_PLANES) return SKN_E_HEADER;
    if (!(p->grid == 0 || (int64_t)p->grid * p->grid == h->tokens)) return SKN_E_HEADER;
    if (p->has_off)
        for (int l = 0; l < h->levels; l++)
            if (!(p->off[l] >= 0.0 && p->off[l] < 1.0)) return SKN_E_HEADER;
    return SKN_OK;
}

int skn_prog_open(skn_prog **out, const skn_prog_header *h)
{
    if (!out) return SKN_E_ARG;
    *out = NULL;
    if (!h) return SKN_E_ARG;
    if (h->tokens < 1 || h->heads < 1 || h->head_dim < 1 || h->levels < 1 || h->levels > SKN_MAX_LEVELS)
        return SKN_E_HEADER;
    const uint64_t lim = h->max_values ? h->max_values : SKN_DEFAULT_MAX_VALUES;
    const uint64_t C = (uint64_t)h->heads * (uint64_t)h->head_dim;
    if (C > (1u << 28) || (uint64_t)h->tokens * C > lim || (uint64_t)h->tokens * C > SKN_DEFAULT_MAX_VALUES)
        return SKN_E_LIMIT;
    for (int i = 0; i < 2; i++) {
        int rc = check_part(h, &h->part[i]);
        if (rc) return rc;
    }
    /* one layout for both parts (every writer uses one transform; the numba decoder assumes it) */
    if (h->part[0].grid != h->part[1].grid) return SKN_E_UNSUPPORTED;
    /* the fast inverse DCT exists for power-of-two grids up to 64 */
    if (h->part[0].grid && ((h->part[0].grid & (h->part[0].grid - 1)) || h->part[0].grid > 64)) return SKN_E_UNSUPPORTED;
    skn_prog *s = calloc(1, sizeof *s);
    if (!s) return SKN_E_NOMEM;
    s->h = *h;
    s->T = h->tokens;
    s->C = (int32_t)C;
    s->TC = (int64_t)h->tokens * (int64_t)C;
    s->grid = h->part[0].grid;
    s->level = -1;
    const int n = s->grid;
    s->nb = n ? 2 * n - 1 : 1;
    s->big = s->TC >= (int64_t)BIG_BAND * s->nb;
    s->perm = malloc((size_t)s->T * sizeof *s->perm);
    s->starts = malloc((size_t)(s->nb + 1) * sizeof *s->starts);
    if (!s->perm || !s->starts) { skn_prog_free(s); return SKN_E_NOMEM; }
    /* rows sorted by band u + v (stable): band b's rows in increasing row order */
    int32_t r = 0;
    for (int b = 0; b < s->nb; b++) {
        s->starts[b] = (int64_t)r * s->C;
        if (!n) { for (int32_t t = 0; t < s->T; t++) s->perm[r++] = t; continue; }
        for (int u = 0; u < n; u++) {
            const int v = b - u;
            if (v >= 0 && v < n) s->perm[r++] = u * n + v;
        }
    }
    s->starts[s->nb] = (int64_t)r * s->C;
    for (int i = 0; i < 2; i++) {
        const skn_prog_part *p = &h->part[i];
        s->mag32[i] = !(((int64_t)p->m0 + 1) << p->planes[h->levels - 1] <= (1 << 15));
        s->mag[i] = skn_big_alloc((size_t)s->TC * (s->mag32[i] ? 4 : 2));
        s->neg[i] = skn_big_alloc((size_t)s->TC);
        s->zeros[i] = malloc((size_t)s->nb * sizeof(int64_t));
        s->mean[i] = malloc((size_t)s->C * sizeof(float));
        if (!s->mag[i] || !s->neg[i] || !s->zeros[i] || !s->mean[i]) { skn_prog_free(s); return SKN_E_NOMEM; }
    }
    *out = s;
    return SKN_OK;
}

int skn_prog_reset(skn_prog *s, const skn_prog_header *h)
{
    if (!s || !h) return SKN_E_ARG;
    skn_prog *fresh = NULL;
    int rc = skn_prog_open(&fresh, h);   /* (checks the header; small next to a decode) */
    if (rc) return rc;
    int same = fresh->T == s->T && fresh->C == s->C && fresh->grid == s->grid;
    for (int i = 0; i < 2; i++) same = same && fresh->mag32[i] == s->mag32[i];
    skn_prog_free(fresh);
    if (!same) return SKN_E_ARG;
    s->h = *h;
    s->level = -1;
    for (int i = 0; i < 2; i++) { free(s->inv[i]); s->inv[i] = NULL; }
    return SKN_OK;
}

int32_t skn_prog_level(const skn_prog *s) { return s ? s->level : -1; }

/* the histogram model of one stream: from the payload (own or no tables) or the shared table */
static int stream_model(skn_prog *s, chunks *rd, int own, const skn_prog_tables *t, int part, int slot, uint32_t A,
                        skn_model *m)
{
    const uint8_t *tab;
    if (own || !t) {
        int rc = chunk_exact(rd, &tab, (size_t)s->nb * A);
        if (rc) return rc;
    } else {
        const skn_u8_table *ut = &t->hist[part][slot];
        if (!ut->data || ut->rows != (uint32_t)s->nb || ut->cols != A) return SKN_E_TABLE;
        tab = ut->data;
    }
    return skn_model_from_logcounts(m, tab, (uint32_t)s->nb, A);
}

/* one rANS stream over the bands: lens[b] symbols in band b (flagged: only where its flag is 1)
 * -> symbols (*sym, malloc'd, *nsym of them), flags nz (nb,) */
static int read_stream(skn_prog *s, chunks *rd, const skn_model *m, const int64_t *lens, int flagged, uint8_t *nz,
                       uint16_t **sym, int64_t *nsym)
{
    const int nb = s->nb;
    int rc;
    *sym = NULL;
    if (flagged) {
        const uint8_t *fl;
        if ((rc = chunk_exact(rd, &fl, (size_t)(nb + 7) / 8))) return rc;
        for (int b = 0; b < nb; b++) nz[b] = (fl[b >> 3] >> (7 - (b & 7))) & 1;
    } else {
        memset(nz, 1, (size_t)nb);
    }
    int32_t *ctx = malloc((size_t)nb * sizeof *ctx);
    int64_t *len = malloc((size_t)nb * sizeof *len);
    if (!ctx || !len) { free(ctx); free(len); return SKN_E_NOMEM; }
    size_t ns = 0;
    int64_t n = 0;
    for (int b = 0; b < nb; b++)
        if (nz[b] && lens[b] > 0) { ctx[ns] = b; len[ns] = lens[b]; ns++; n += lens[b]; }
    const uint8_t *w, *c;
    size_t wn, cn;
    if ((rc = chunk_next(rd, &w, &wn)) || (rc = chunk_next(rd, &c, &cn))) goto out;
    if ((wn & 1) || (cn & 3)) { rc = SKN_E_PAYLOAD; goto out; }
    *sym = malloc((size_t)(n ? n : 1) * sizeof **sym);
    if (!*sym) { rc = SKN_E_NOMEM; goto out; }
    skn_stream st = {w, wn / 2, c, cn / 4, 0};
    rc = skn_rans_run(&st, ctx, len, ns, m, SKN_PIECE, *sym, n);
    *nsym = n;
out:
    free(ctx);
    free(len);
    if (rc) { free(*sym); *sym = NULL; }
    return rc;
}


#define QA(v) ((v) < 0 ? -(v) : (v))
#define QD(s, i) ((s) / (i) % 3 - 1)
#define M4(s) {QA(QD(s, 1)), QA(QD(s, 3)), QA(QD(s, 9)), QA(QD(s, 27))}
#define N4(s) {QD(s, 1) < 0, QD(s, 3) < 0, QD(s, 9) < 0, QD(s, 27) < 0}
#define Z4(s) ((QD(s, 1) == 0) + (QD(s, 3) == 0) + (QD(s, 9) == 0) + (QD(s, 27) == 0))
#define R9(X, s) X(s), X(s + 1), X(s + 2), X(s + 3), X(s + 4), X(s + 5), X(s + 6), X(s + 7), X(s + 8)
#define R81(X) R9(X, 0), R9(X, 9), R9(X, 18), R9(X, 27), R9(X, 36), R9(X, 45), R9(X, 54), R9(X, 63), R9(X, 72)
/* per quad symbol (0..80; 81 = escape, handled apart): its four magnitudes, signs, zeros */
static const int16_t QMAG16[82][4] = {R81(M4)};
static const int32_t QMAG32[82][4] = {R81(M4)};
static const uint8_t QNEG[82][4] = {R81(N4)};
static const uint8_t QZERO[82] = {R81(Z4)};

#define QMAG_T QMAG16
#define MAGT int16_t
#define SUFFIX _16
#define SKN_MAG16 1
#include "prog_mag.h"
#undef QMAG_T
#undef MAGT
#undef SUFFIX
#undef SKN_MAG16
#define QMAG_T QMAG32
#define MAGT int32_t
#define SUFFIX _32
#define SKN_MAG16 0
#include "prog_mag.h"
#undef QMAG_T
#undef MAGT
#undef SUFFIX
#undef SKN_MAG16

#define SETMAG(i, v) do { if (m32) ((int32_t *)mag)[i] = (int32_t)(v); else ((int16_t *)mag)[i] = (int16_t)(v); } while (0)
#define GETMAG(i) (m32 ? ((int32_t *)mag)[i] : (int32_t)((int16_t *)mag)[i])

static int rung0_part(skn_prog *s, chunks *rd, int i, int own, const skn_prog_tables *t)
{
    const skn_prog_part *p = &s->h.part[i];
    const int nb = s->nb, m32 = s->mag32[i];
    const int32_t m0 = p->m0;
    void *mag = s->mag[i];
    uint8_t *neg = s->neg[i];
    int64_t *zeros = s->zeros[i];
    int rc;
    /* mean */
    if (t) {
        if (!t->mean[i]) return SKN_E_TABLE;
        memcpy(s->mean[i], t->mean[i], (size_t)s->C * sizeof(float));
    } else {
        const uint8_t *mb;
        if ((rc = chunk_exact(rd, &mb, (size_t)s->C * (p->mean_f32 ? 4 : 2)))) return rc;
        for (int32_t c = 0; c < s->C; c++) {
            if (p->mean_f32) { uint32_t u = skn_rd32(mb + 4 * c); memcpy(&s->mean[i][c], &u, 4); }
            else s->mean[i][c] = half_to_float(skn_rd16(mb + 2 * c));
        }
    }
    double amax = 0.0;
    for (int32_t c = 0; c < s->C; c++) {
        if (!isfinite(s->mean[i][c])) return SKN_E_NONFINITE;
        const double a = fabs((double)s->mean[i][c]);
        if (a > amax) amax = a;
    }
    s->mean_absmax[i] = amax;
    /* token scales */
    free(s->inv[i]);
    s->inv[i] = NULL;
    s->min_scale[i] = 1.0;
    if (p->scaled) {
        const uint8_t *codes;
        if ((rc = chunk_exact(rd, &codes, (size_t)s->T))) return rc;
        s->inv[i] = malloc((size_t)s->T * sizeof(float));
        if (!s->inv[i]) return SKN_E_NOMEM;
        double mn = INFINITY;
        for (int32_t tk = 0; tk < s->T; tk++) {
            const double sc = SKN_TOKEN_SCALE[codes[tk]];
            s->inv[i][tk] = (float)sc;
            if (sc < mn) mn = sc;
        }
        s->min_scale[i] = mn;
    }
    /* models: big layouts e0q (82) then e0 (2 m0 + 1); small ones e0 */
    skn_model mq = {0}, me = {0};
    const uint32_t Ae = 2 * (uint32_t)m0 + 1;
    if (s->big && (rc = stream_model(s, rd, own, t, i, 0, QUAD_ESC + 1, &mq))) return rc;
    if ((rc = stream_model(s, rd, own, t, i, 1, Ae, &me))) { skn_model_free(&mq); return rc; }
    int64_t *lens = malloc((size_t)nb * sizeof *lens);
    uint8_t *nz = malloc((size_t)nb), *nze = malloc((size_t)nb);
    uint16_t *sym = NULL, *ev = NULL;
    int64_t nsym = 0, nev = 0;
    if (!lens || !nz || !nze) { rc = SKN_E_NOMEM; goto out; }
    if (s->big) {
        for (int b = 0; b < nb; b++) lens[b] = (s->starts[b + 1] - s->starts[b] + 3) / 4;
        if ((rc = read_stream(s, rd, &mq, lens, 1, nz, &sym, &nsym))) goto out;
        /* escapes per band (the escape stream's segments) */
        int64_t ptr = 0;
        for (int b = 0; b < nb; b++) {
            lens[b] = 0;
            if (!nz[b]) continue;
            const int64_t nq = (s->starts[b + 1] - s->starts[b] + 3) / 4;
            if (ptr + nq > nsym) { rc = SKN_E_COVER; goto out; }
            int64_t c = 0;
            for (int64_t k = 0; k < nq; k++) c += sym[ptr + k] == QUAD_ESC;
            lens[b] = 4 * c;
            ptr += nq;
        }
        if (ptr != nsym) { rc = SKN_E_COVER; goto out; }
        if ((rc = read_stream(s, rd, &me, lens, 0, nze, &ev, &nev))) goto out;
        rc = m32 ? expand_quads_32(s, sym, nsym, nz, ev, nev, m0, mag, neg, zeros)
                 : expand_quads_16(s, sym, nsym, nz, ev, nev, m0, mag, neg, zeros);
        if (rc) goto out;

    } else {
        for (int b = 0; b < nb; b++) lens[b] = s->starts[b + 1] - s->starts[b];
        if ((rc = read_stream(s, rd, &me, lens, 1, nz, &sym, &nsym))) goto out;
        rc = m32 ? expand_signed_32(s, sym, nsym, nz, m0, mag, neg, zeros)
                 : expand_signed_16(s, sym, nsym, nz, m0, mag, neg, zeros);
        if (rc) goto out;
    }
out:
    free(lens);
    free(nz);
    free(nze);
    free(sym);
    free(ev);
    skn_model_free(&mq);
    skn_model_free(&me);
    return rc;
}

int skn_prog_start(skn_prog *s, const uint8_t *payload, size_t n, const int32_t *own, size_t n_own,
                   const skn_prog_tables *tables)
{
    if (!s || (!own && n_own)) return SKN_E_ARG;
    if (s->level != -1) return SKN_E_ORDER;
    chunks rd;
    int rc = chunks_open(&rd, payload, n);
    if (rc) return rc;
    for (int i = 0; i < 2; i++) {
        if ((size_t)i >= n_own || (own[i] != 0 && own[i] != 1)) return SKN_E_HEADER;
        if ((rc = rung0_part(s, &rd, i, own[i], tables))) return rc;
    }
    if (rd.i != rd.count) return SKN_E_PAYLOAD;
    s->level = 0;
    return SKN_OK;
}

static int refine_part(skn_prog *s, chunks *rd, int i, int own, const skn_prog_tables *t, int l, int m)
{
    const int nb = s->nb, m32 = s->mag32[i];
    const int g = (s->big && m <= 4) ? (4 / m > 1 ? 4 / m : 1) : 1;
    const uint32_t A = 1u << (m * g);
    void *mag = s->mag[i];
    uint8_t *neg = s->neg[i];
    int64_t *counts = s->zeros[i];
    skn_model md = {0};
    int rc = stream_model(s, rd, own, t, i, 1 + l, A, &md);
    if (rc) return rc;
    int64_t *lens = malloc((size_t)nb * sizeof *lens), *sptr = malloc((size_t)(nb + 1) * sizeof *sptr);
    int64_t *became = malloc((size_t)nb * sizeof *became);
    uint8_t *nz = malloc((size_t)nb);
    uint16_t *sym = NULL;
    uint8_t *lowp = NULL, *sgp = NULL, *nzf = NULL;
    int64_t nsym = 0;
    if (!lens || !sptr || !became || !nz) { rc = SKN_E_NOMEM; goto out; }
    for (int b = 0; b < nb; b++) lens[b] = (counts[b] + g - 1) / g;
    if ((rc = read_stream(s, rd, &md, lens, 1, nz, &sym, &nsym))) goto out;
    const uint8_t *low, *sg;
    size_t nlow, nsg;
    if ((rc = chunk_next(rd, &low, &nlow)) || (rc = chunk_next(rd, &sg, &nsg))) goto out;
    /* per band: its symbols' offset and how many coefficients become significant (nzf: the nonzero
       fields of each symbol value, a table lookup instead of a branch per symbol and field) */
    const uint32_t fmask = (1u << m) - 1;
    nzf = malloc(A);
    if (!nzf) { rc = SKN_E_NOMEM; goto out; }
    for (uint32_t v = 0; v < A; v++) {
        int k = 0;
        for (int f = 0; f < g; f++) k += ((v >> (m * f)) & fmask) != 0;
        nzf[v] = (uint8_t)k;
    }
    int64_t ptr = 0, nins = 0, nbec = 0;
    for (int b = 0; b < nb; b++) {
        sptr[b] = ptr;
        became[b] = 0;
        nins += counts[b];
        if (!nz[b]) continue;
        const int64_t ns = (counts[b] + g - 1) / g;
        if (ptr + ns > nsym) { rc = SKN_E_COVER; goto out; }
        int64_t c = 0;
        const int64_t full = counts[b] / g;
        for (int64_t t = 0; t < full; t++) c += nzf[sym[ptr + t]];   /* (symbols are < A) */
        for (int64_t k = full * g; k < counts[b]; k++) c += ((sym[ptr + full] >> (m * (k - full * g))) & fmask) != 0;
        became[b] = c;
        nbec += c;
        ptr += ns;
    }
    sptr[nb] = ptr;
    if (ptr != nsym) { rc = SKN_E_COVER; goto out; }
    const int64_t nsig = s->TC - nins;
    if ((uint64_t)nsig * (uint64_t)m > (uint64_t)nlow * 8 || (uint64_t)nbec > (uint64_t)nsg * 8) {
        rc = SKN_E_PAYLOAD;
        goto out;
    }
    /* the padded copies the kernel reads 3-byte windows of, and the scratch */
    int64_t maxband = 0;
    for (int b = 0; b < nb; b++)
        if (s->starts[b + 1] - s->starts[b] > maxband) maxband = s->starts[b + 1] - s->starts[b];
    lowp = calloc(nlow + 4, 1);
    sgp = calloc(nsg + 4, 1);
    if (!lowp || !sgp || scratch((void **)&s->lowv, &s->lowv_cap, (size_t)nsig + 16, sizeof *s->lowv) ||
        scratch((void **)&s->newv, &s->newv_cap, (size_t)maxband + 16, sizeof *s->newv) ||
        scratch((void **)&s->sv, &s->sv_cap, (size_t)nbec + 16, 1)) {
        rc = SKN_E_NOMEM;
        goto out;
    }
    if (nlow) memcpy(lowp, low, nlow);
    if (nsg) memcpy(sgp, sg, nsg);
    rc = m32 ? refine_32(s, mag, neg, counts, nz, sym, sptr, m, g, lowp, sgp, nsig, nbec, s->lowv, s->newv, s->sv)
             : refine_16(s, mag, neg, counts, nz, sym, sptr, m, g, lowp, sgp, nsig, nbec, s->lowv, s->newv, s->sv);
    if (rc) goto out;
    for (int b = 0; b < nb; b++) counts[b] -= became[b];
out:
    free(lens);
    free(sptr);
    free(became);
    free(nz);
    free(sym);
    free(lowp);
    free(sgp);
    free(nzf);
    skn_model_free(&md);
    return rc;
}

int skn_prog_upgrade(skn_prog *s, int32_t level, const uint8_t *payload, size_t n, const int32_t *own, size_t n_own,
                     const skn_prog_tables *tables)
{
    if (!s || (!own && n_own)) return SKN_E_ARG;
    if (s->level < 0 || level != s->level + 1) return SKN_E_ORDER;
    if (level >= s->h.levels) return SKN_E_HEADER;
    chunks rd;
    int rc = chunks_open(&rd, payload, n);
    if (rc) return rc;
    size_t j = 0;
    for (int i = 0; i < 2; i++) {
        const skn_prog_part *p = &s->h.part[i];
        const int m = p->planes[level] - p->planes[level - 1];
        if (m == 0) continue;
        if (j >= n_own || (own[j] != 0 && own[j] != 1)) return SKN_E_HEADER;
        if ((rc = refine_part(s, &rd, i, own[j], tables, level, m))) return rc;
        j++;
    }
    if (rd.i != rd.count) return SKN_E_PAYLOAD;
    s->level = level;
    return SKN_OK;
}

static int nonfinite16(const uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((x[i] & 0x7c00) == 0x7c00) return 1;
    return 0;
}

int32_t skn_prog_blocks(const skn_prog *s)
{
    if (!s) return 0;
    if (!s->grid) return 1;
    const int cb = skn_block_channels(s->grid);
    return (s->C + cb - 1) / cb;
}

int skn_prog_result_part_f16(skn_prog *s, int32_t part, int32_t lo, int32_t hi, uint16_t *out)
{
    if (!s || !out || part < 0 || part > 1 || lo < 0 || hi > skn_prog_blocks(s) || lo > hi) return SKN_E_ARG;
    if (s->level < 0) return SKN_E_ORDER;
    const int n = s->grid, i = part;
    if (n && ((n & (n - 1)) || n > 64)) return SKN_E_UNSUPPORTED;
    if (lo == hi) return SKN_OK;
    const skn_kernels *k = skn_kernels_get();
    const skn_prog_part *p = &s->h.part[i];
    const float st = (float)(p->step * ldexp(1.0, -p->planes[s->level]));
    const float off = (float)(p->has_off ? p->off[s->level] : 0.5);
    if (lo == 0) skn_hint_huge(out, (size_t)s->TC * 2);   /* (before this call's first write) */
    if (n) {
        float *fl = malloc((size_t)n * skn_row_stride(n) * sizeof(float));
        if (!fl) return SKN_E_NOMEM;
        int rc = k->idct2_f16(n, s->mag32[i], s->mag[i], s->neg[i], s->perm, st, off, lo, hi, s->inv[i], s->mean[i],
                              s->C, out, fl);
        free(fl);
        return rc;
    }
    float *row = malloc((size_t)s->C * sizeof(float));
    if (!row) return SKN_E_NOMEM;
    const int m32 = s->mag32[i];
    const void *mag = s->mag[i];
    for (int32_t t = 0; t < s->T; t++) {
        const int64_t base = (int64_t)t * s->C;
        for (int32_t c = 0; c < s->C; c++) {
            const int32_t q = GETMAG(base + c);
            float v = ((float)q + off) * st;
            v = s->neg[i][base + c] ? -v : v;
            v = q != 0 ? v : 0.0f;
            if (s->inv[i]) v = v / s->inv[i][t];
            row[c] = v + s->mean[i][c];
        }
        k->to_f16(row, (size_t)s->C, out + base);
    }
    free(row);
    return SKN_OK;
}

int skn_prog_check_f16(const skn_prog *s, const uint16_t *key, const uint16_t *value)
{
    if (!s || !key || !value) return SKN_E_ARG;
    if (s->level < 0) return SKN_E_ORDER;
    double bound = 0.0;
    for (int i = 0; i < 2; i++) {
        const skn_prog_part *p = &s->h.part[i];
        const double inv = p->scaled ? 1.0 / s->min_scale[i] : 1.0;
        const double b = (p->m0 + 1.0) * p->step * (s->grid > 1 ? s->grid : 1) * inv + s->mean_absmax[i];
        if (b > bound) bound = b;
    }
    /* only a forged step or mean gets here: then check every value (as the reference does) */
    if (bound >= 65504.0 && (nonfinite16(key, (size_t)s->TC) || nonfinite16(value, (size_t)s->TC)))
        return SKN_E_NONFINITE;
    return SKN_OK;
}

int skn_prog_result_f16(skn_prog *s, uint16_t *key, uint16_t *value)
{
    if (!s || !key || !value) return SKN_E_ARG;
    const int32_t nb = skn_prog_blocks(s);
    int rc = skn_prog_result_part_f16(s, 0, 0, nb, key);
    if (rc == SKN_OK) rc = skn_prog_result_part_f16(s, 1, 0, nb, value);
    if (rc == SKN_OK) rc = skn_prog_check_f16(s, key, value);
    return rc;
}
