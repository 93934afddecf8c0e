/* The magnitude kernels of prog.c for one magnitude type (included twice: MAGT = int16_t, int32_t,
 * SUFFIX the function suffix). Specialised by type so that the inner loops carry no type test. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define F(name) CAT(name, SUFFIX)

/* rung 0, big layout: the quad symbols of the flagged bands (and the escaped quads' values from
 * ev, 4 per escape) -> magnitudes, signs, zeros per band. Returns 0 or SKN_E_COVER. */
static int F(expand_quads)(const skn_prog *s, const uint16_t *sym, int64_t nsym, const uint8_t *nz,
                           const uint16_t *ev, int64_t nev, int32_t m0, MAGT *mag, uint8_t *neg, int64_t *zeros)
{
    int64_t ptr = 0, ei = 0;
    for (int b = 0; b < s->nb; b++) {
        const int64_t a = s->starts[b], e = s->starts[b + 1];
        if (!nz[b]) {
            memset(mag + a, 0, (size_t)(e - a) * sizeof(MAGT));
            memset(neg + a, 0, (size_t)(e - a));
            zeros[b] = e - a;
            continue;
        }
        const int64_t nq = (e - a + 3) / 4, full = (e - a) / 4;
        if (ptr + nq > nsym) return SKN_E_COVER;
        const uint16_t *qs = sym + ptr;
        int64_t z = 0;
        for (int64_t k = 0; k < nq; k++) {
            const uint16_t q = qs[k];
            MAGT *mo = mag + a + 4 * k;
            uint8_t *no = neg + a + 4 * k;
            const int cnt = k < full ? 4 : (int)(e - a - 4 * k);
            if (q == QUAD_ESC) {
                if (ei + 4 > nev) return SKN_E_COVER;
                for (int i = 0; i < cnt; i++) {
                    const int32_t v = (int32_t)ev[ei + i] - m0;
                    mo[i] = (MAGT)(v < 0 ? -v : v);
                    no[i] = v < 0;
                    z += v == 0;
                }
                ei += 4;
            } else if (cnt == 4) {
                const MAGT *qm = QMAG_T[q];
                memcpy(mo, qm, 4 * sizeof(MAGT));
                memcpy(no, QNEG[q], 4);
                z += QZERO[q];
            } else {
                for (int i = 0; i < cnt; i++) {
                    mo[i] = QMAG_T[q][i];
                    no[i] = QNEG[q][i];
                    z += QMAG_T[q][i] == 0;
                }
            }
        }
        zeros[b] = z;
        ptr += nq;
    }
    return (ptr == nsym && ei == nev) ? SKN_OK : SKN_E_COVER;
}

/* rung 0, small layout: symbols v + m0 of the flagged bands -> magnitudes, signs, zeros. */
static int F(expand_signed)(const skn_prog *s, const uint16_t *sym, int64_t nsym, const uint8_t *nz, int32_t m0,
                            MAGT *mag, uint8_t *neg, int64_t *zeros)
{
    int64_t ptr = 0;
    for (int b = 0; b < s->nb; b++) {
        const int64_t a = s->starts[b], e = s->starts[b + 1];
        if (!nz[b]) {
            memset(mag + a, 0, (size_t)(e - a) * sizeof(MAGT));
            memset(neg + a, 0, (size_t)(e - a));
            zeros[b] = e - a;
            continue;
        }
        if (ptr + (e - a) > nsym) return SKN_E_COVER;
        const uint16_t *sb = sym + ptr;
        int64_t z = 0;
        for (int64_t j = 0; j < e - a; j++) {
            const int32_t v = (int32_t)sb[j] - m0;
            mag[a + j] = (MAGT)(v < 0 ? -v : v);
            neg[a + j] = v < 0;
            z += v == 0;
        }
        zeros[b] = z;
        ptr += e - a;
    }
    return ptr == nsym ? SKN_OK : SKN_E_COVER;
}

/* One refinement of one part, in three steps (numba's `kernels.refine`, the same bits):
 *  1. the m low bits of every significant coefficient (little-endian bit stream `low`, flat order)
 *     unpacked into lowv, and the sign bits of the coefficients that become significant (`sg`, most
 *     significant bit first) into bytes sv: each value independent, no bit walk in the merge;
 *  2. per band, its new indices (g per symbol of `sym`, flagged bands only; 0 elsewhere) ungrouped
 *     into newv (the band's stay in cache);
 *  3. the merge, one pass over the band: a significant coefficient q becomes (q << m) | the next
 *     low value, an insignificant one the next new index (and, if that is nonzero, the next sign).
 *     8 coefficients per step on the vector paths (`merge16`: the lane masks expand consecutive
 *     lowv / newv / sv values into place by one table shuffle each), branch-free per coefficient
 *     elsewhere: which way a coefficient goes is data, and a branch on it mispredicts ~1 in 3.
 * Insignificant coefficients keep magnitude and sign 0 (an invariant of every rung), so a merged
 * value is (q << m) | low | new and a sign is old | new. lowv: nsig + 16 entries, newv: largest
 * band + 16, sv: nbec + 16 (the vector loads read up to 16 past the cursors). low / sg have 4 bytes
 * of zero padding past the bits the caller checked are there. */
static int F(refine)(skn_prog *s, MAGT *mag, uint8_t *neg, const int64_t *counts, const uint8_t *nz,
                     const uint16_t *sym, const int64_t *sptr, int m, int g, const uint8_t *low, const uint8_t *sg,
                     int64_t nsig, int64_t nbec, int16_t *lowv, int16_t *newv, uint8_t *sv)
{
    const uint32_t fmask = (1u << m) - 1;
    for (int64_t i = 0; i < nsig; i++) {
        const uint64_t bit = (uint64_t)i * (uint64_t)m;
        const size_t by = (size_t)(bit >> 3);
        const uint32_t wd = (uint32_t)low[by] | ((uint32_t)low[by + 1] << 8) | ((uint32_t)low[by + 2] << 16);
        lowv[i] = (int16_t)((wd >> (bit & 7)) & fmask);
    }
    memset(lowv + nsig, 0, 16 * sizeof *lowv);
    for (int64_t i = 0; i < nbec; i++) sv[i] = (sg[i >> 3] >> (7 - (i & 7))) & 1;
    memset(sv + nbec, 0, 16);
#if SKN_MAG16
    const skn_kernels *kern = skn_kernels_get();
#endif
    int64_t li = 0, si = 0;
    for (int b = 0; b < s->nb; b++) {
        const int64_t a = s->starts[b], len = s->starts[b + 1] - a, n = counts[b];
        if (n < 0 || n > len) return SKN_E_COVER;
        if (!nz[b] && n == len) continue;   /* nothing significant, nothing coded: all stay zero */
        if (nz[b]) {
            const uint16_t *sb = sym + sptr[b];
            int64_t k = 0;
            if (g == 4)
                for (; k + 4 <= n; k += 4) {
                    const uint32_t v = sb[k >> 2];
                    newv[k] = (int16_t)(v & fmask);
                    newv[k + 1] = (int16_t)((v >> m) & fmask);
                    newv[k + 2] = (int16_t)((v >> (2 * m)) & fmask);
                    newv[k + 3] = (int16_t)((v >> (3 * m)) & fmask);
                }
            else if (g == 2)
                for (; k + 2 <= n; k += 2) {
                    const uint32_t v = sb[k >> 1];
                    newv[k] = (int16_t)(v & fmask);
                    newv[k + 1] = (int16_t)((v >> m) & fmask);
                }
            for (; k < n; k++) newv[k] = (int16_t)((sb[k / g] >> (m * (k % g))) & fmask);
        } else {
            memset(newv, 0, (size_t)n * sizeof *newv);
        }
        memset(newv + n, 0, 16 * sizeof *newv);
        MAGT *mb = mag + a;
        uint8_t *gb = neg + a;
        int64_t ki = 0, j = 0;
#if SKN_MAG16
        if (kern->merge16) j = kern->merge16(mb, gb, len, m, lowv, &li, nsig + 16, newv, &ki, n + 16, sv, &si, nbec + 16);
#endif
        for (; j < len; j++) {
            /* branch-free: both ways computed, one kept (reads clamped to the buffers; a count
               that does not add up is caught below) */
            const int32_t q = mb[j];
            const int sig = q != 0;
            const int32_t r = lowv[li < nsig ? li : nsig];
            const int32_t v = newv[ki < n ? ki : n];
            const int bec = !sig && v != 0;
            mb[j] = (MAGT)(sig ? (q << m) | r : v);
            gb[j] = (uint8_t)(gb[j] | (bec ? sv[si < nbec ? si : nbec] : 0));
            li += sig;
            ki += !sig;
            si += bec;
        }
        if (ki != n) return SKN_E_COVER;
    }
    return (li == nsig && si == nbec) ? SKN_OK : SKN_E_COVER;
}

#undef F
#undef CAT
#undef CAT_
