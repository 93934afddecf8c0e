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

/* One refinement of one part, touching only what changes: per band, the positions of its
 * significant coefficients (one scan, skipping zero runs 4 at a time), each appending m low
 * bits (little-endian bit stream `low`, in flat order); then the band's new indices (g per symbol
 * of `sym`, flagged bands only; all-zero symbols skipped 4 at a time): the k-th insignificant
 * coefficient sits at k + (significant ones before it), and a nonzero new index takes the next
 * sign bit (`sg`, most significant bit first). Insignificant coefficients that stay zero keep
 * magnitude and sign 0 (an invariant of every rung). pos: scratch of the largest band's size.
 * low / sg have 4 bytes of zero padding past nlow / nsg (the caller checked the counts). */
static int F(refine)(skn_prog *s, MAGT *mag, uint8_t *neg, const int64_t *counts, const uint8_t *nz,
                     const uint16_t *sym, const int64_t *sptr, int m, int g, const uint8_t *low, const uint8_t *sg,
                     int32_t *pos)
{
    const uint32_t fmask = (1u << m) - 1;
    uint64_t li = 0, si = 0;
    for (int b = 0; b < s->nb; b++) {
        const int64_t a = s->starts[b], e = s->starts[b + 1];
        /* significant positions (relative to a) */
        int64_t ns = 0, j = a;
        for (; j + 4 <= e; j += 4) {
            uint64_t w;
            memcpy(&w, mag + j, sizeof w < 4 * sizeof(MAGT) ? sizeof w : 4 * sizeof(MAGT));
            if (sizeof(MAGT) == 2 && w == 0) continue;
            for (int i = 0; i < 4; i++)
                if (mag[j + i] != 0) pos[ns++] = (int32_t)(j + i - a);
        }
        for (; j < e; j++)
            if (mag[j] != 0) pos[ns++] = (int32_t)(j - a);
        if (ns + counts[b] != e - a) return SKN_E_COVER;
        /* their low bits */
        for (int64_t i = 0; i < ns; i++) {
            const uint64_t bit = (li + (uint64_t)i) * (uint64_t)m;
            const size_t by = (size_t)(bit >> 3);
            const uint32_t w = (uint32_t)low[by] | ((uint32_t)low[by + 1] << 8) | ((uint32_t)low[by + 2] << 16);
            MAGT *p = mag + a + pos[i];
            *p = (MAGT)(((uint32_t)*p << m) | ((w >> (bit & 7)) & fmask));
        }
        li += (uint64_t)ns;
        if (!nz[b]) continue;
        /* the new indices */
        const int64_t n = counts[b], nsym = (n + g - 1) / g;
        const uint16_t *sb = sym + sptr[b];
        int64_t c = 0;
        for (int64_t t = 0; t < nsym; t++) {
            if (t + 4 <= nsym) {
                uint64_t w;
                memcpy(&w, sb + t, 8);
                if (w == 0) { t += 3; continue; }
            }
            const uint32_t v0 = sb[t];
            if (!v0) continue;
            for (int f = 0; f < g; f++) {
                const int64_t k = t * g + f;
                const uint32_t v = (v0 >> (m * f)) & fmask;
                if (!v || k >= n) continue;
                while (c < ns && pos[c] <= k + c) c++;
                const int64_t q = a + k + c;
                mag[q] = (MAGT)v;
                neg[q] = (sg[si >> 3] >> (7 - (si & 7))) & 1;
                si++;
            }
        }
    }
    return SKN_OK;
}

#undef F
#undef CAT
#undef CAT_
