"""The native decoders' array kernels (numba, `nogil=True`, `cache=True`): everything between the
rANS symbols and the float coefficients, one pass each, so that a decode thread never holds the GIL
for long. Each kernel has a plain-numpy twin in the module that uses it (the reference decoder);
tests check they agree bit for bit.

Flat arrays are the progressive ladder's band-sorted (T*C,) order; `starts` (nbands + 1,) are the
bands' flat offsets.

Indexing style matters 10-20x here: numba adds a negative-index wraparound check to every signed
index it cannot prove >= 0, and that check stops LLVM vectorising. So loops run over slices with
`range(0, n)`, and computed indices are cast to unsigned (`_u`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_u = np.uint64

QUAD_ESC = 81
QUAD_ZERO = 40   # the quad of four zeros: (0+1)(1 + 3 + 9 + 27)


_QMAG = np.zeros((82, 4), np.int32)
_QNEG = np.zeros((82, 4), np.uint8)
for _s in range(81):
    for _i in range(4):
        _v = (_s // 3 ** _i) % 3 - 1
        _QMAG[_s, _i] = abs(_v)
        _QNEG[_s, _i] = 1 if _v < 0 else 0


@njit(nogil=True, cache=True)
def expand_quads(qsym, nzq, starts, m0, mag, neg, esc_pos, esc_end, esc_count):
    """Rung 0 of a big layout: quad symbols of the flagged bands -> magnitudes / signs; escaped
    quads' flat offsets (and their band ends) are listed for `fill_escapes`. Returns the number
    of escapes, or -1 if the symbols do not cover the flagged bands exactly."""
    nb = starts.size - 1
    qm = _QMAG
    qn = _QNEG
    ptr = 0
    ne = 0
    for b in range(nb):
        a = starts[b]
        e = starts[b + 1]
        esc_count[b] = 0
        if not nzq[b]:
            mag[a:e] = 0
            neg[a:e] = 0
            continue
        nq = (e - a + 3) // 4
        if ptr + nq > qsym.size:
            return -1
        full = (e - a) // 4
        qs = qsym[ptr:ptr + nq]
        mb = mag[a:e]
        nb_ = neg[a:e]
        for k in range(full):   # whole quads; escapes (rare) are listed, their values zeroed for now
            s = _u(qs[k])
            if s == QUAD_ESC:
                esc_pos[ne] = a + 4 * k
                esc_end[ne] = e
                ne += 1
                esc_count[b] += 1
            for i in range(4):
                mb[4 * k + i] = qm[s, i]
                nb_[4 * k + i] = qn[s, i]
        if full < nq:           # the band's last, partial quad
            s = qsym[ptr + full]
            pos = a + 4 * full
            if s == QUAD_ESC:
                esc_pos[ne] = pos
                esc_end[ne] = e
                ne += 1
                esc_count[b] += 1
            for i in range(e - pos):
                mag[pos + i] = qm[s, i]
                neg[pos + i] = qn[s, i]
        ptr += nq
    if ptr != qsym.size:
        return -1
    return ne


@njit(nogil=True, cache=True)
def fill_escapes(ev, esc_pos, esc_end, ne, m0, mag, neg):
    """Escaped quads' four values (symbols v + m0, band order) into magnitudes / signs."""
    for k in range(ne):
        pos = esc_pos[k]
        e = esc_end[k]
        for i in range(4):
            if pos + i < e:
                v = ev[4 * k + i] - m0
                mag[pos + i] = -v if v < 0 else v
                neg[pos + i] = 1 if v < 0 else 0


@njit(nogil=True, cache=True)
def signed_to_mag(sym, nz, starts, m0, mag, neg):
    """Rung 0 of a small layout: symbols v + m0 of the flagged bands -> magnitudes / signs.
    Returns False if the symbols do not cover the flagged bands exactly."""
    nb = starts.size - 1
    ptr = 0
    for b in range(nb):
        a = starts[b]
        e = starts[b + 1]
        if not nz[b]:
            mag[a:e] = 0
            neg[a:e] = 0
            continue
        if ptr + (e - a) > sym.size:
            return False
        sb = sym[ptr:ptr + (e - a)]
        mb = mag[a:e]
        nb_ = neg[a:e]
        for k in range(e - a):
            v = sb[k] - m0
            mb[k] = -v if v < 0 else v
            nb_[k] = 1 if v < 0 else 0
        ptr += e - a
    return ptr == sym.size


@njit(nogil=True, cache=True)
def insignificant_counts(mag, starts, out):
    """(nb,) number of zero magnitudes per band."""
    for b in range(starts.size - 1):
        seg = mag[starts[b]:starts[b + 1]]
        c = 0
        for k in range(seg.size):
            c += seg[k] == 0
        out[b] = c


@njit(nogil=True, cache=True)
def refine(mag, neg, starts, nz, counts, sym, m, g, low, signs):
    """One refinement rung in place: significant magnitudes get m low bits (`low`, little-endian
    bit stream, m bits per value in flat order), insignificant ones their new index (ungrouped
    from `sym`, g per symbol, band order; 0 in unflagged bands), and a sign bit from `signs`
    (big-endian within bytes) if it became significant. Returns 0, or 1 if a bit stream is short.

    Branch-free per coefficient (both paths computed, one kept): which path a coefficient takes is
    data, so branches were mispredicted ~1 in 3 (the kernel ran 3x slower with them). `low` and
    `signs` must carry 4 bytes of zero padding (the caller copies them so)."""
    mmask = (1 << m) - 1
    lg = 0 if g == 1 else 1 if g == 2 else 2
    nlow = (low.size - 4) * 8
    nsign = (signs.size - 4) * 8
    slast = signs.size - 1
    lbit = 0
    sbit = 0
    ptr = 0
    if sym.size == 0:
        sym = np.zeros(1, np.int32)   # nothing coded: every band unflagged, v is 0
    last = sym.size - 1
    for b in range(starts.size - 1):
        k = 0
        f = 1 if nz[b] else 0
        a = starts[b]
        e = starts[b + 1]
        if f == 0 and counts[b] == e - a:   # nothing significant, nothing coded: all stay zero
            continue
        # significant coefficients need their m bits: check once per band
        if lbit + m * ((e - a) - counts[b]) > nlow:
            return 1
        mb = mag[a:e]
        nb_ = neg[a:e]
        for j in range(e - a):
            q = mb[j]
            sig = 1 if q != 0 else 0
            # significant path: m bits at lbit
            by = _u(lbit >> 3)
            w = np.int64(low[by]) | (np.int64(low[by + _u(1)]) << 8) | (np.int64(low[by + _u(2)]) << 16)
            r = (w >> (lbit & 7)) & mmask
            # insignificant path: the k-th new index of this band
            si = ptr + (k >> lg)
            si = _u(si if si < last else last)
            v = ((np.int64(sym[si]) >> (m * (k & (g - 1)))) & mmask) * f
            nw = 1 - sig
            became = nw * (v > 0)
            sx = sbit >> 3   # clamped: a short sign stream is caught after the band, never read past
            sb = (signs[_u(sx if sx < slast else slast)] >> (7 - (sbit & 7))) & 1
            # arithmetic blends, not selects: LLVM turns selects over loads back into branches
            mb[j] = sig * ((np.int64(q) << m) | r) + nw * v
            nb_[j] = sig * nb_[j] + became * sb
            lbit += m * sig
            k += nw
            sbit += became
        if sbit > nsign:
            return 1
        if f:
            ptr += (counts[b] + g - 1) // g
    return 0


@njit(nogil=True, cache=True)
def reconstruct(mag, neg, perm, C, step, out):
    """Dead-zone reconstruction into (T, C) float32 in token-grid order: sign (mag + 1/2) step,
    0 where mag is 0; band-sorted row r lands at row perm[r]. float32 arithmetic as the reference."""
    T = perm.size
    half = np.float32(0.5)
    st = np.float32(step)
    for r in range(T):
        mr = mag[r * C:(r + 1) * C]
        nr = neg[r * C:(r + 1) * C]
        o = out[perm[r]]
        for c in range(C):
            q = mr[c]
            v = (np.float32(q) + half) * st
            v = -v if nr[c] else v
            o[c] = v if q != 0 else np.float32(0.0)


@njit(nogil=True, cache=True)
def reconstruct_blocks(mag, neg, perm, C, step, cb, out):
    """`reconstruct` straight into channel blocks: out (C // cb, T, cb) float32, block b holding
    channels [b cb, (b+1) cb) of every token-grid row, so the inverse DCT reads each block in place
    (no copy) while it is in cache. Same float32 arithmetic as `reconstruct`."""
    T = perm.size
    half = np.float32(0.5)
    st = np.float32(step)
    nblk = C // cb
    for r in range(T):
        mr = mag[r * C:(r + 1) * C]
        nr = neg[r * C:(r + 1) * C]
        row = perm[r]
        for b in range(nblk):
            o = out[b, row]
            mb = mr[b * cb:(b + 1) * cb]
            nb_ = nr[b * cb:(b + 1) * cb]
            for c in range(cb):
                q = mb[c]
                v = (np.float32(q) + half) * st
                v = -v if nb_[c] else v
                o[c] = v if q != 0 else np.float32(0.0)


@njit(nogil=True, cache=True)
def cachegen_dequant(sym, amax, mx, out):
    """CacheGen: (C, T) symbols (channel-major, as coded) -> (C, T) float32 (s - MAX) amax_t / MAX
    (float32 as the reference: (s - MAX) first, then times amax_t / MAX). Channel-major out: a
    transposing write here ran at 8 ns per value; the caller transposes with torch (~1 ns)."""
    C, T = sym.shape
    fmx = np.float32(mx)
    scale = np.empty(T, np.float32)
    for t in range(T):
        scale[t] = np.float32(amax[t]) / fmx
    for c in range(C):
        sc = sym[c]
        o = out[c]
        for t in range(T):
            o[t] = np.float32(sc[t] - mx) * scale[t]


def warm_up() -> None:
    """Compile or load every kernel once (tiny inputs)."""
    starts = np.array([0, 4, 8], np.int64)
    mag = np.zeros(8, np.int32)
    neg = np.zeros(8, np.uint8)
    nz = np.array([1, 0], np.uint8)
    ep, ee, ec = np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64)
    ne = expand_quads(np.array([QUAD_ESC], np.int32), nz, starts, 2, mag, neg, ep, ee, ec)
    fill_escapes(np.array([0, 1, 2, 4], np.int32), ep, ee, ne, 2, mag, neg)
    signed_to_mag(np.array([0, 1, 2, 3], np.int32), nz, starts, 2, mag, neg)
    cnt = np.zeros(2, np.int64)
    insignificant_counts(mag, starts, cnt)
    refine(mag, neg, starts, nz, cnt, np.zeros(4, np.int32), 1, 1, np.zeros(6, np.uint8), np.zeros(6, np.uint8))
    out = np.empty((2, 4), np.float32)
    reconstruct(mag, neg, np.array([1, 0], np.int64), 4, 0.5, out)
    reconstruct_blocks(mag, neg, np.array([1, 0], np.int64), 4, 0.5, 2, np.empty((2, 2, 2), np.float32))
    cachegen_dequant(np.zeros((2, 4), np.int32), np.ones(4, np.float32), 3, out)
