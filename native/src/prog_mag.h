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

/* bit i set where p[i] == 0, i < 64 */
static SKN_INLINE uint64_t F(zero_mask64)(const MAGT *p)
{
    uint64_t z = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (int i = 0; i < 64; i += 16) {
        __m128i e0, e1;
        if (sizeof(MAGT) == 2) {
            e0 = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(p + i)), zero);
            e1 = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(p + i + 8)), zero);
        } else {
            e0 = _mm_packs_epi32(_mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(p + i)), zero),
                                 _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(p + i + 4)), zero));
            e1 = _mm_packs_epi32(_mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(p + i + 8)), zero),
                                 _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(p + i + 12)), zero));
        }
        z |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_packs_epi16(e0, e1)) << i;
    }
#else
    for (int i = 0; i < 64; i++) z |= (uint64_t)(p[i] == 0) << i;
#endif
    return z;
}

/* One refinement of one part, touching only what changes: per band, a bit mask of its
 * insignificant (zero) coefficients, 64 per word (one scan of the band's magnitudes); its
 * significant ones (the clear bits, lowest first) each append m low bits (little-endian bit
 * stream `low`, in flat order); then the band's new indices (g per symbol of `sym`, flagged bands
 * only; all-zero symbols skipped 4 at a time): the k-th insignificant coefficient is the k-th set
 * bit of the mask (word by word popcounts, then a branch-free select in the word), and a nonzero
 * new index takes the next sign bit (`sg`, most significant bit first). Insignificant
 * coefficients that stay zero keep magnitude and sign 0 (an invariant of every rung).
 * zm: scratch of (largest band + 63) / 64 words. low / sg have 4 bytes of zero padding past
 * nlow / nsg (the caller checked the counts). */
static int F(refine)(skn_prog *s, MAGT *mag, uint8_t *neg, const int64_t *counts, const uint8_t *nz,
                     const uint16_t *sym, const int64_t *sptr, int m, int g, const uint8_t *low, const uint8_t *sg,
                     uint64_t *zm)
{
    const uint32_t fmask = (1u << m) - 1;
    uint64_t li = 0, si = 0;
    for (int b = 0; b < s->nb; b++) {
        const int64_t a = s->starts[b], e = s->starts[b + 1], len = e - a;
        MAGT *mb = mag + a;
        /* the zero mask, and the significant ones' low bits (in flat order) */
        const int64_t nw = (len + 63) / 64;
        int64_t nzero = 0;
        for (int64_t w = 0; w < nw; w++) {
            const int64_t j0 = 64 * w, cnt = len - j0 < 64 ? len - j0 : 64;
            uint64_t z = 0;
            if (cnt == 64) {
                uint64_t any = 0, wd;   /* most words of the high bands are all zero: one test */
                for (int i = 0; i < 64; i += (int)(8 / sizeof(MAGT))) { memcpy(&wd, mb + j0 + i, 8); any |= wd; }
                if (!any) {
                    zm[w] = ~UINT64_C(0);
                    nzero += 64;
                    continue;
                }
                z = F(zero_mask64)(mb + j0);
            } else {
                for (int i = 0; i < cnt; i++) z |= (uint64_t)(mb[j0 + i] == 0) << i;
            }
            zm[w] = z;
            nzero += skn_popcount64(z);
            uint64_t sig = cnt == 64 ? ~z : ~z & ((UINT64_C(1) << cnt) - 1);
            while (sig) {
                const int i = __builtin_ctzll(sig);
                sig &= sig - 1;
                const uint64_t bit = li * (uint64_t)m;
                const size_t by = (size_t)(bit >> 3);
                const uint32_t wd = (uint32_t)low[by] | ((uint32_t)low[by + 1] << 8) | ((uint32_t)low[by + 2] << 16);
                MAGT *p = mb + j0 + i;
                *p = (MAGT)(((uint32_t)*p << m) | ((wd >> (bit & 7)) & fmask));
                li++;
            }
        }
        if (nzero != counts[b]) return SKN_E_COVER;
        if (!nz[b]) continue;
        /* the new indices */
        const int64_t n = counts[b], nsym = (n + g - 1) / g;
        const uint16_t *sb = sym + sptr[b];
        int64_t w = 0, before = 0;   /* zm[w] holds zeros before..before + popcount(zm[w]) - 1 */
        int pc = nw ? skn_popcount64(zm[0]) : 0;
        for (int64_t t = 0; t < nsym; t++) {
            if (t + 4 <= nsym) {
                uint64_t wv;
                memcpy(&wv, sb + t, 8);
                if (wv == 0) { t += 3; continue; }
            }
            const uint32_t v0 = sb[t];
            if (!v0) continue;
            for (int f = 0; f < g; f++) {
                const int64_t k = t * g + f;
                const uint32_t v = (v0 >> (m * f)) & fmask;
                if (!v || k >= n) continue;
                while (k >= before + pc) { before += pc; pc = skn_popcount64(zm[++w]); }   /* k < n = zeros */
                const int64_t q = a + 64 * w + skn_select64(zm[w], (int)(k - before));
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
