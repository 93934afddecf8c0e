/* rANS models (wire-format 4.6): weights -> quantised frequencies, numpy's float64 arithmetic
 * step for step (its pairwise row sums included), so C and numba build the same tables. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "skn_internal.h"
#include "gen_tables.h"

/* numpy's pairwise summation of a contiguous float64 run (numpy/_core/src/umath/loops_utils.h) */
static double pairwise_sum(const double *a, size_t n)
{
    if (n < 8) {
        double res = 0.0;
        for (size_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        size_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

void skn_model_free(skn_model *m)
{
    free(m->freq);
    free(m->cum);
    m->freq = m->cum = NULL;
}

int skn_model_build(skn_model *m, const double *w, uint32_t rows, uint32_t A)
{
    memset(m, 0, sizeof *m);
    if (A < 2 || A > SKN_MAX_ALPHABET || rows == 0 || rows > (1u << 20)) return SKN_E_TABLE;
    const uint32_t bits = A <= 2048 ? 14 : 16;
    const double M = (double)(1u << bits);
    m->rows = rows; m->A = A; m->bits = bits;
    m->freq = malloc((size_t)rows * A * sizeof *m->freq);
    m->cum = malloc((size_t)rows * (A + 1) * sizeof *m->cum);
    double *p = malloc((size_t)A * sizeof *p);
    if (!m->freq || !m->cum || !p) { free(p); skn_model_free(m); return SKN_E_NOMEM; }
    for (uint32_t r = 0; r < rows; r++) {
        const double *wr = w + (size_t)r * A;
        for (uint32_t s = 0; s < A; s++)
            if (!(wr[s] > 0.0) || !isfinite(wr[s])) { free(p); skn_model_free(m); return SKN_E_TABLE; }
        const double sum = pairwise_sum(wr, A);
        uint32_t best = 0;
        int64_t total = 0;
        uint32_t *f = m->freq + (size_t)r * A;
        for (uint32_t s = 0; s < A; s++) {
            p[s] = wr[s] / sum;
            if (p[s] > p[best]) best = s;     /* first argmax, as numpy */
            f[s] = 1 + (uint32_t)floor(p[s] * (M - (double)A));
            total += f[s];
        }
        f[best] = (uint32_t)((int64_t)f[best] + ((int64_t)M - total));
        uint32_t *c = m->cum + (size_t)r * (A + 1);
        c[0] = 0;
        for (uint32_t s = 0; s < A; s++) c[s + 1] = c[s] + f[s];
    }
    free(p);
    return SKN_OK;
}

int skn_model_from_logcounts(skn_model *m, const uint8_t *t, uint32_t rows, uint32_t A)
{
    if (A < 2 || A > SKN_MAX_ALPHABET || rows == 0) return SKN_E_TABLE;
    double *w = malloc((size_t)rows * A * sizeof *w);
    if (!w) return SKN_E_NOMEM;
    for (size_t i = 0; i < (size_t)rows * A; i++) w[i] = SKN_LOGCOUNT_WEIGHT[t[i]] + 1.0;
    int rc = skn_model_build(m, w, rows, A);
    free(w);
    return rc;
}

int skn_model_from_counts(skn_model *m, const uint32_t *cnt, uint32_t rows, uint32_t A)
{
    if (A < 2 || A > SKN_MAX_ALPHABET || rows == 0) return SKN_E_TABLE;
    double *w = malloc((size_t)rows * A * sizeof *w);
    if (!w) return SKN_E_NOMEM;
    for (size_t i = 0; i < (size_t)rows * A; i++) w[i] = (double)cnt[i] + 1.0;
    int rc = skn_model_build(m, w, rows, A);
    free(w);
    return rc;
}
