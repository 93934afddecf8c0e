/* The rANS piece decoder, one instance per slot-table type: rans.c includes this file once per
   type with WORKER (the function name), TABT (the slot table's element type) and BUILD (its
   filler) defined, so no type test runs per symbol. */
static int WORKER(const skn_stream *st, const int32_t *seg_ctx, const int64_t *seg_len, size_t n_seg,
                  const skn_model *m, int64_t piece, uint16_t *out, int64_t n, TABT *tab, uint64_t *fc)
{
    const int64_t pieces = (n + piece - 1) / piece;
    (void)n_seg;   /* (validated by skn_rans_run: the segments add up to n) */
    const int lanes = (st->whole ? st->whole : n) >= BIG_STREAM ? LANES_BIG : 1;
    const uint32_t bits = m->bits, mask = (1u << bits) - 1;
    const uint8_t *w = st->words;
    int rc = SKN_OK;
    size_t seg = 0;
    int64_t seg_end = seg_len[0];
    int64_t cur = -1;
    int64_t p = 0;
    for (int64_t pc = 0; pc < pieces && rc == SKN_OK; pc++) {
        const int64_t a = pc * piece, b = (a + piece < n) ? a + piece : n;
        const int64_t pend = p + skn_rd32(st->counts + 4 * pc);
        uint32_t x[LANES_BIG];
        if (pend - p < 2 * lanes) { rc = SKN_E_RANS_WORDS; break; }
        for (int l = 0; l < lanes; l++) {
            x[l] = ((uint32_t)skn_rd16(w + 2 * p) << 16) | skn_rd16(w + 2 * (p + 1));
            p += 2;
        }
        int64_t i = a;
        while (i < b) {
            while (seg_end <= i) { seg++; seg_end += seg_len[seg]; }
            const uint32_t c = (uint32_t)seg_ctx[seg];
            if ((int64_t)c != cur) { BUILD(m, c, tab, fc); cur = c; }
            const int64_t stop = b < seg_end ? b : seg_end;
            int64_t j = i;
            /* One loop: a checked single step, except where lane 0 starts an 8-lane block with >= 8
               words left (a step reads at most one word, so such a block needs no checks). Once the
               blocks stop (words or piece running out) they cannot resume: both only shrink. */
            while (j < stop) {
                if (lanes == LANES_BIG && ((j - a) & (lanes - 1)) == 0 && j + 8 <= stop && pend - p >= 8) {
                    for (int l = 0; l < 8; l++) {
                        uint32_t xx = x[l];
                        const uint32_t slot = xx & mask, s = (uint32_t)tab[slot];
                        xx = (uint32_t)fc[s] * (xx >> bits) + slot - (uint32_t)(fc[s] >> 32);
                        const uint32_t need = xx < SKN_RANS_L;
                        const uint32_t wd = skn_rd16(w + 2 * p);
                        xx = need ? (xx << 16) | wd : xx;
                        p += need;
                        x[l] = xx;
                        out[j + l] = (uint16_t)s;
                    }
                    j += 8;
                    continue;
                }
                const int l = (int)((j - a) & (lanes - 1));
                uint32_t xx = x[l];
                const uint32_t slot = xx & mask, s = (uint32_t)tab[slot];
                xx = (uint32_t)fc[s] * (xx >> bits) + slot - (uint32_t)(fc[s] >> 32);
                if (xx < SKN_RANS_L) {
                    if (p >= pend) { rc = SKN_E_RANS_WORDS; goto done; }
                    xx = (xx << 16) | skn_rd16(w + 2 * p);
                    p++;
                }
                x[l] = xx;
                out[j++] = (uint16_t)s;
            }
            i = stop;
        }
        if (p != pend) { rc = SKN_E_RANS_LEFTOVER; break; }
        for (int l = 0; l < lanes; l++)
            if (x[l] != SKN_RANS_L) { rc = SKN_E_RANS_STATE; break; }
    }
done:
    return rc;
}

