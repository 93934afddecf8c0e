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

import platform
import threading

import numpy as np
import llvmlite.binding as llvm

from . import target as _target

_target.configure()
from llvmlite import ir  # noqa: E402  (numba after the decode target is set)
from numba import njit, types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

_u = np.uint64

_SCRATCH = threading.local()


def scratch(name: str, n: int, dtype) -> np.ndarray:
    """This thread's reusable (n,) buffer `name` (uninitialised; grown when too small). For a
    decode's temporaries (and one-shot decodes' magnitudes): a fresh array of tens of MB is fresh
    pages, one page fault and a zeroing per 4 KiB, ~30 % of a 4,096-token decode. A buffer lives
    until the same thread asks for the same name again: only for memory no result refers to."""
    d = _SCRATCH.__dict__
    a = d.get(name)
    dt = np.dtype(dtype)
    if a is None or a.size < n or a.dtype != dt:
        a = np.empty(max(n, 1), dt)
        d[name] = a
    return a[:n]

QUAD_ESC = 81
QUAD_ZERO = 40   # the quad of four zeros: (0+1)(1 + 3 + 9 + 27)


_QMAG = np.zeros((82, 4), np.int32)
_QNEG = np.zeros((82, 4), np.uint8)
for _s in range(81):
    for _i in range(4):
        _v = (_s // 3 ** _i) % 3 - 1
        _QMAG[_s, _i] = abs(_v)
        _QNEG[_s, _i] = 1 if _v < 0 else 0
_QZERO = np.zeros(82, np.int64)   # zeros among a quad symbol's four values (escape, 81: counted apart)
for _s in range(81):
    _QZERO[_s] = int((_QMAG[_s] == 0).sum())


@njit(nogil=True, cache=True)
def quad_escape_counts(qsym, nzq, starts, esc_count):
    """Rung 0 of a big layout, before the escape stream: the escaped quads per band (esc_count
    (nb,): the escape stream's segment lengths are 4x these). Returns the number of escapes, or
    -1 if the quad symbols do not cover the flagged bands exactly."""
    ptr = 0
    ne = 0
    for b in range(starts.size - 1):
        if not nzq[b]:
            esc_count[b] = 0
            continue
        nq = (starts[b + 1] - starts[b] + 3) // 4
        if ptr + nq > qsym.size:
            return -1
        qs = qsym[ptr:ptr + nq]
        c = 0
        for k in range(nq):
            c += qs[k] == QUAD_ESC
        esc_count[b] = c
        ne += c
        ptr += nq
    if ptr != qsym.size:
        return -1
    return ne


@njit(nogil=True, cache=True)
def expand_quads_escapes(qsym, nzq, starts, m0, ev, mag, neg, zeros):
    """Rung 0 of a big layout in one pass (after `quad_escape_counts` and the escape stream):
    quad symbols of the flagged bands -> magnitudes / signs, an escaped quad's four values from
    `ev` (symbols v + m0, 4 per escape, band order; a band's last partial quad uses the first
    e - pos), and per band the number of zero magnitudes. It replaced a two-pass expansion (quads,
    then escapes over them) that wrote the escaped quads twice (at high rates most quads escape).
    The caller has checked the coverage (`quad_escape_counts`) and that ev holds 4 per escape."""
    qm = _QMAG
    qn = _QNEG
    qz = _QZERO
    ptr = 0
    ei = 0
    for b in range(starts.size - 1):
        a = starts[b]
        e = starts[b + 1]
        if not nzq[b]:
            mag[a:e] = 0
            neg[a:e] = 0
            zeros[b] = e - a
            continue
        nq = (e - a + 3) // 4
        full = (e - a) // 4
        qs = qsym[ptr:ptr + nq]
        mb = mag[a:e]
        nb_ = neg[a:e]
        z = 0
        for k in range(full):
            s = _u(qs[k])
            if s == QUAD_ESC:
                for i in range(4):
                    v = ev[ei + i] - m0
                    mb[4 * k + i] = -v if v < 0 else v
                    nb_[4 * k + i] = 1 if v < 0 else 0
                    z += v == 0
                ei += 4
            else:
                z += qz[s]
                for i in range(4):
                    mb[4 * k + i] = qm[s, i]
                    nb_[4 * k + i] = qn[s, i]
        if full < nq:           # the band's last, partial quad
            s = _u(qsym[ptr + full])
            pos = a + 4 * full
            if s == QUAD_ESC:
                for i in range(e - pos):
                    v = ev[ei + i] - m0
                    mag[pos + i] = -v if v < 0 else v
                    neg[pos + i] = 1 if v < 0 else 0
                    z += v == 0
                ei += 4
            else:
                for i in range(e - pos):
                    mag[pos + i] = qm[s, i]
                    neg[pos + i] = qn[s, i]
                    z += qm[s, i] == 0
        zeros[b] = z
        ptr += nq


@njit(nogil=True, cache=True)
def signed_to_mag(sym, nz, starts, m0, mag, neg, zeros):
    """Rung 0 of a small layout: symbols v + m0 of the flagged bands -> magnitudes / signs, and
    the zero magnitudes per band (zeros (nb,)). Returns False if the symbols do not cover the
    flagged bands exactly."""
    nb = starts.size - 1
    ptr = 0
    for b in range(nb):
        a = starts[b]
        e = starts[b + 1]
        if not nz[b]:
            mag[a:e] = 0
            neg[a:e] = 0
            zeros[b] = e - a
            continue
        if ptr + (e - a) > sym.size:
            return False
        sb = sym[ptr:ptr + (e - a)]
        mb = mag[a:e]
        nb_ = neg[a:e]
        z = 0
        for k in range(e - a):
            v = sb[k] - m0
            mb[k] = -v if v < 0 else v
            nb_[k] = 1 if v < 0 else 0
            z += v == 0
        zeros[b] = z
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
def unpack_low(low, m, n, out):
    """out[i] = the i-th m-bit value of the little-endian bit stream `low` (i < n; 4 bytes of zero
    padding): independent per value, so the loop vectorises."""
    mmask = (1 << m) - 1
    for i in range(n):
        bit = i * m
        by = _u(bit >> 3)
        w = np.int64(low[by]) | (np.int64(low[by + _u(1)]) << 8) | (np.int64(low[by + _u(2)]) << 16)
        out[i] = (w >> (bit & 7)) & mmask


@njit(nogil=True, cache=True, inline="always")
def _ungroup_band(sb, n, m, g, o):
    """One flagged band's n new indices -> o[:n], ungrouped from its symbols sb (g per symbol)."""
    mmask = (1 << m) - 1
    lg = 0 if g == 1 else 1 if g == 2 else 2
    full = n // g if g in (2, 4) else 0
    # whole symbols with the fields unrolled (g = 4: 2.1x faster than a field per
    # iteration, whose k >> lg index kept LLVM from vectorising); the rest field by field
    if g == 4:
        for t in range(full):
            v = sb[t]
            o4 = o[4 * t:4 * t + 4]
            o4[0] = v & mmask
            o4[1] = (v >> m) & mmask
            o4[2] = (v >> (2 * m)) & mmask
            o4[3] = (v >> (3 * m)) & mmask
    elif g == 2:
        for t in range(full):
            v = sb[t]
            o2 = o[2 * t:2 * t + 2]
            o2[0] = v & mmask
            o2[1] = (v >> m) & mmask
    for k in range(full * g, n):
        o[k] = (sb[_u(k >> lg)] >> (m * (k & (g - 1)))) & mmask


@njit(nogil=True, cache=True)
def ungroup_bands(sym, nz, counts, m, g, out):
    """The new indices of every insignificant coefficient in flat order -> out (sum(counts),):
    ungrouped from `sym` (g per symbol, band order) in flagged bands, 0 in unflagged ones. Returns
    False if the symbols do not cover the flagged bands exactly."""
    ptr = 0
    at = 0
    for b in range(counts.size):
        n = counts[b]
        o = out[at:at + n]
        if not nz[b]:
            o[:] = 0
        else:
            ns = (n + g - 1) // g
            if ptr + ns > sym.size:
                return False
            _ungroup_band(sym[ptr:ptr + ns], n, m, g, o)
            ptr += ns
        at += n
    return ptr == sym.size


def _host_has(feature: str) -> bool:
    try:
        return bool(llvm.get_host_cpu_features().get(feature, False))
    except Exception:   # (an llvmlite without the query: take the portable path)
        return False


# Lanes of the vector kernels (`refine`'s merge, `_merge_lanes`; `sig_positions`), 0 for their
# scalar loops. The vector merge needs
# an expanding load of 16- and 8-bit elements (AVX-512 VBMI2 `vpexpandw` / `vpexpandb`); elsewhere
# LLVM lowers `llvm.masked.expandload` to one conditional load per lane, slower than the scalar
# merge, so there the scalar merge runs. Both give the same bits (tests run both).
# The phone-class target (`target.py`, SAKURA_DECODE_TARGET=phone) runs the portable loops: no
# phone has these instructions.
#
# 8: the 128-bit kernels: `_merge_lanes8` expands 8 lanes by one byte shuffle (SSSE3 `pshufb`;
# NEON's `tbl` does the same, with the same 0x80 = zero convention) by a row of a 256-entry table
# indexed by the 8-bit lane mask; `sig_positions` walks 64-lane masks bit by bit (generic vector
# IR). Every x86-64 CPU since 2006 has SSSE3, the phone-class proxy (x86-64-v2) included; other
# architectures (no shuffle emitted for them yet) run the scalar loops.
#: whether this process's JIT target has the 128-bit byte shuffle the lanes-8 kernels emit
BYTE_SHUFFLE = (platform.machine().lower() in ("x86_64", "amd64")
                and (_target.current() == "phone" or _host_has("ssse3")))
if _target.current() == "host" and _host_has("avx512vbmi2"):
    VECTOR_LANES = 16
elif BYTE_SHUFFLE:
    VECTOR_LANES = 8
else:
    VECTOR_LANES = 0
#: extra elements the caller allocates past the end of `refine`'s scratch
#: arrays, so that the 128-bit kernels' whole-vector loads and stores stay inside them
VECTOR_PAD = 16


def _splat(builder, vty, x):
    """Codegen: the vector vty with x (a scalar of its element type) in every lane."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.IntType(32)(0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vty.count), None)   # shuffle mask: lane 0 everywhere
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), zeros)


def _popcount(builder, mask):
    """Codegen: the number of set lanes of a 16-lane i1 mask, as an i64."""
    i16 = ir.IntType(16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i16, [i16]), "llvm.ctpop.i16")
    return builder.zext(builder.call(fn, [builder.bitcast(mask, i16)]), ir.IntType(64))


@intrinsic
def _merge_lanes(typingctx, mag, neg, j, lowv, li, newv, ki, sv, si, m):
    """`refine`'s merge of 16 coefficients mag[j:j+16], neg[j:j+16] in one go: a lane whose
    magnitude is nonzero (significant) takes (mag << m) | the next low bits from lowv[li:], the
    others the next new indices from newv[ki:], and a lane that became significant the next sign
    from sv[si:] (expanding loads: the k-th selected lane gets the k-th value). -> (significant
    lanes, lanes that became significant), by which the caller advances li, ki (16 - significant)
    and si. The scalar merge's arithmetic lane by lane (the same bits); reads no element past the
    ones it uses."""
    W = 16
    if not (isinstance(mag, types.Array) and mag.dtype in (types.int32, types.int16) and isinstance(neg, types.Array)
            and neg.dtype == types.uint8 and isinstance(lowv, types.Array) and lowv.dtype == types.int16
            and isinstance(newv, types.Array) and newv.dtype == types.int16 and isinstance(sv, types.Array)
            and sv.dtype == types.uint8):
        return None

    def codegen(context, builder, signature, args):
        amag, aneg, jj, alow, ll, anew, kk, asv, ss, mm = args
        tys = signature.args

        def at(k, idx):   # &array_k[idx]; an array's index is the argument after it (mag's and neg's: j)
            ary = context.make_array(tys[k])(context, builder, args[k])
            i = context.cast(builder, idx, tys[k + 1] if k in (3, 5, 7) else tys[2], types.intp)
            return builder.gep(ary.data, [i])

        i1, i8, i16, i32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
        v16, v8, vm = ir.VectorType(i16, W), ir.VectorType(i8, W), ir.VectorType(i1, W)
        wide = tys[0].dtype == types.int32
        v32 = ir.VectorType(i32, W) if wide else v16      # the magnitudes' vector type
        mod = builder.module

        def ext(v):
            return builder.zext(v, v32) if wide else v

        def expand(vty, name, ptr, mask):
            fnty = ir.FunctionType(vty, [ptr.type, vm, vty])
            fn = cgutils.get_or_insert_function(mod, fnty, f"llvm.masked.expandload.{name}")
            return builder.call(fn, [ptr, mask, ir.Constant(vty, None)])

        pmag = builder.bitcast(at(0, jj), v32.as_pointer())
        pneg = builder.bitcast(at(1, jj), v8.as_pointer())
        q = builder.load(pmag, align=2)
        sig = builder.icmp_unsigned("!=", q, ir.Constant(v32, None))
        ins = builder.not_(sig)
        lo = expand(v16, "v16i16", at(3, ll), sig)
        nw = expand(v16, "v16i16", at(5, kk), ins)
        sh = context.cast(builder, mm, tys[9], types.int32 if wide else types.int16)
        sigval = builder.or_(builder.shl(q, _splat(builder, v32, sh)), ext(lo))
        builder.store(builder.select(sig, sigval, ext(nw)), pmag, align=2)
        bec = builder.and_(ins, builder.icmp_unsigned("!=", nw, ir.Constant(v16, None)))
        sb = expand(v8, "v16i8", at(7, ss), bec)
        n0 = builder.load(pneg, align=1)
        builder.store(builder.select(sig, n0, sb), pneg, align=1)
        return context.make_tuple(builder, signature.return_type, [_popcount(builder, sig), _popcount(builder, bec)])
    return types.UniTuple(types.int64, 2)(mag, neg, j, lowv, li, newv, ki, sv, si, m), codegen


def _shuffle_tables() -> tuple[np.ndarray, np.ndarray]:
    """Byte-shuffle controls by 8-bit lane mask M (0x80: a zero byte): EXP16[M] expands 8 int16
    lanes (lane i, if bit i of M is set, takes element popcount(M below i) of the source, else
    0); EXP8[M] the same for 8 uint8 lanes (upper 8 bytes zero)."""
    exp16 = np.full((256, 16), 0x80, np.uint8)
    exp8 = np.full((256, 16), 0x80, np.uint8)
    for msk in range(256):
        k = 0
        for i in range(8):
            if msk >> i & 1:
                exp16[msk, 2 * i:2 * i + 2] = (2 * k, 2 * k + 1)
                exp8[msk, i] = k
                k += 1
    return exp16, exp8


_EXP16, _EXP8 = _shuffle_tables()


def _byte_shuffle(builder, v, ctl):
    """Codegen: <16 x i8> v shuffled by the <16 x i8> control ctl (byte i = v[ctl[i]], 0 where
    ctl[i] has its top bit set): SSSE3 `pshufb`."""
    v16 = ir.VectorType(ir.IntType(8), 16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16]), "llvm.x86.ssse3.pshuf.b.128")
    return builder.call(fn, [v, ctl])


def _table_row(context, builder, tty, tab, idx):
    """Codegen: row idx (i32) of a (256, 16) uint8 table, as <16 x i8>."""
    ary = context.make_array(tty)(context, builder, tab)
    off = builder.mul(builder.zext(idx, ir.IntType(64)), ir.Constant(ir.IntType(64), 16))
    ptr = builder.gep(ary.data, [off])
    return builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(8), 16).as_pointer()), align=1)


def _popcount8(builder, bits):
    """Codegen: the set bits of an i8, as an i64."""
    i8 = ir.IntType(8)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i8, [i8]), "llvm.ctpop.i8")
    return builder.zext(builder.call(fn, [bits]), ir.IntType(64))


@intrinsic
def _merge_lanes8(typingctx, mag, neg, j, lowv, li, newv, ki, sv, si, m, exp16, exp8):
    """`_merge_lanes` 8 coefficients at a time in 128-bit vectors: the expanding loads are whole
    16-byte loads (lowv[li:li+8], newv[ki:ki+8], sv[si:si+16]: the caller keeps them inside the
    arrays) shuffled by the table row of the lane mask (`_EXP16`, `_EXP8`: one `pshufb` each).
    -> (significant lanes, lanes that became significant); the same bits as the scalar merge."""
    W = 8
    if not (isinstance(mag, types.Array) and mag.dtype in (types.int32, types.int16) and isinstance(neg, types.Array)
            and neg.dtype == types.uint8 and isinstance(lowv, types.Array) and lowv.dtype == types.int16
            and isinstance(newv, types.Array) and newv.dtype == types.int16 and isinstance(sv, types.Array)
            and sv.dtype == types.uint8 and isinstance(exp16, types.Array) and exp16.dtype == types.uint8
            and isinstance(exp8, types.Array) and exp8.dtype == types.uint8):
        return None

    def codegen(context, builder, signature, args):
        amag, aneg, jj, alow, ll, anew, kk, asv, ss, mm, at16, at8 = args
        tys = signature.args

        def at(k, idx):
            ary = context.make_array(tys[k])(context, builder, args[k])
            i = context.cast(builder, idx, tys[k + 1] if k in (3, 5, 7) else tys[2], types.intp)
            return builder.gep(ary.data, [i])

        i1, i8, i16, i32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
        v8x16, b16, b8 = ir.VectorType(i16, W), ir.VectorType(i8, 16), ir.VectorType(i8, W)
        wide = tys[0].dtype == types.int32
        vq = ir.VectorType(i32, W) if wide else v8x16

        def ext(v):
            return builder.zext(v, vq) if wide else v

        def expand16(ptr, bits):   # 8 int16 from ptr, expanded by the 8-bit mask `bits`
            raw = builder.load(builder.bitcast(ptr, b16.as_pointer()), align=1)
            ctl = _table_row(context, builder, tys[10], at16, bits)
            return builder.bitcast(_byte_shuffle(builder, raw, ctl), v8x16)

        pmag = builder.bitcast(at(0, jj), vq.as_pointer())
        pneg = builder.bitcast(at(1, jj), b8.as_pointer())
        q = builder.load(pmag, align=2)
        sig = builder.icmp_unsigned("!=", q, ir.Constant(vq, None))
        sbits = builder.bitcast(sig, i8)
        lo = expand16(at(3, ll), sbits)
        nw = expand16(at(5, kk), builder.not_(sbits))
        sh = context.cast(builder, mm, tys[9], types.int32 if wide else types.int16)
        sigval = builder.or_(builder.shl(q, _splat(builder, vq, sh)), ext(lo))
        builder.store(builder.select(sig, sigval, ext(nw)), pmag, align=2)
        bec = builder.and_(builder.not_(sig), builder.icmp_unsigned("!=", nw, ir.Constant(v8x16, None)))
        bbits = builder.bitcast(bec, i8)
        sraw = builder.load(builder.bitcast(at(7, ss), b16.as_pointer()), align=1)
        sx = _byte_shuffle(builder, sraw, _table_row(context, builder, tys[11], at8, bbits))
        sb = builder.shuffle_vector(sx, ir.Constant(b16, ir.Undefined), ir.Constant(ir.VectorType(i32, W), list(range(W))))
        n0 = builder.load(pneg, align=1)
        builder.store(builder.select(sig, n0, sb), pneg, align=1)
        return context.make_tuple(builder, signature.return_type, [_popcount8(builder, sbits), _popcount8(builder, bbits)])
    return types.UniTuple(types.int64, 2)(mag, neg, j, lowv, li, newv, ki, sv, si, m, exp16, exp8), codegen


@njit(nogil=True, cache=True)
def refine(mag, neg, starts, nz, counts, sym, m, g, low, signs, lowv, newv, sv, lanes=0):
    """One refinement rung in place: significant magnitudes get m low bits (`low`, little-endian
    bit stream, m bits per value in flat order), insignificant ones their new index (ungrouped
    from `sym`, g per symbol, band order; 0 in unflagged bands), and a sign bit from `signs`
    (big-endian within bytes) if it became significant. Returns 0, 1 if a bit stream is short, 2
    if the symbols do not cover the flagged bands. `low` and `signs` must carry 4 bytes of zero
    padding (the caller copies them so). lowv (>= nsig + 1,), newv and sv (>= nins + 1,): the
    caller's scratch memory (int16, int16, uint8: values < 2^m <= 2^12; int16 halves the unpacked
    arrays' memory traffic against int32), reused from call to call: fresh arrays cost a page
    fault per 4 KiB (~30 % of a 4,096-token upgrade).

    The low bits are unpacked first, each band's new indices just before its merge (each value
    independent: vectorised; a band's stay in cache), so the merge, whose two cursors advance with the data, does one load per input
    instead of a bit walk (the single-pass walk cost ~1.7 ns per coefficient, this ~3x less). The
    merge is branch-free (both paths computed, one kept): which path a coefficient takes is data,
    and branches were mispredicted ~1 in 3. Bands with no new indices coded only shift in
    the low bits of their significant coefficients. `lanes` = 16: the merge takes 16
    coefficients per step where a band has them (`_merge_lanes`, expanding vector loads; 2.3x
    faster than the scalar merge on a Klein V part with AVX-512 VBMI2), the same bits."""
    nins = 0
    for b in range(counts.size):
        nins += counts[b]
    nsig = mag.size - nins
    if nsig * m > (low.size - 4) * 8:
        return 1
    unpack_low(low, m, nsig, lowv)
    lowv[nsig] = 0
    # the symbols' coverage and the new significant ones per band from the symbols themselves;
    # the new indices are unpacked band by band below, into the start of newv, just before the
    # band's merge: the band's (<= ~100 KB) stay in cache, where the whole part's unpacked ahead
    # (2 bytes per insignificant coefficient: 25 MB per Klein V part at 4,096 tokens) went to
    # memory and back
    sptr = np.empty(counts.size + 1, np.int64)
    became = np.empty(counts.size, np.int64)
    if not refinement_counts(sym, nz, counts, m, g, sptr, became):
        return 2
    nbec = 0
    for b in range(counts.size):
        nbec += became[b]
    if nbec > (signs.size - 4) * 8:
        return 1
    for i in range(nbec):                    # the sign bits as bytes (one load in the merge)
        sv[i] = (signs[_u(i >> 3)] >> (7 - (i & 7))) & 1
    sv[nbec] = 0
    li = 0
    ki = 0
    si = 0
    for b in range(starts.size - 1):
        a = starts[b]
        e = starts[b + 1]
        if nz[b] == 0 and counts[b] == e - a:   # nothing significant, nothing coded: all stay zero
            continue
        mb = mag[a:e]
        nb_ = neg[a:e]
        if nz[b] == 0:   # no new indices coded here: the insignificant stay zero, only low bits move
            for j in range(e - a):
                q = mb[j]
                sig = 1 if q != 0 else 0
                mb[j] = (q << m) | (sig * lowv[_u(li)])
                li += sig
            continue
        nb = counts[b]
        _ungroup_band(sym[sptr[b]:sptr[b + 1]], nb, m, g, newv)   # this band's new indices: newv[:nb]
        newv[nb] = 0
        ki = 0
        j0 = 0
        if lanes == 16:
            while j0 + 16 <= e - a:
                ns, nbc = _merge_lanes(mag, neg, a + j0, lowv, li, newv, ki, sv, si, m)
                li += ns
                ki += 16 - ns
                si += nbc
                j0 += 16
        elif lanes == 8:
            # whole-vector loads: only while 8 int16 (16 sign bytes) remain in each scratch array
            # (the callers allocate VECTOR_PAD more); the band's rest runs the scalar tail below
            while j0 + 8 <= e - a and li + 8 <= lowv.size and ki + 8 <= newv.size and si + 16 <= sv.size:
                ns, nbc = _merge_lanes8(mag, neg, a + j0, lowv, li, newv, ki, sv, si, m, _EXP16, _EXP8)
                li += ns
                ki += 8 - ns
                si += nbc
                j0 += 8
        else:
            # Portable (`lanes` 0): blocks of 16 whose coefficients are all insignificant (most of
            # them where a part refines densely: ~95 % insignificant on the Klein V part) take 16
            # new indices in one vectorised copy, all-significant ones 16 low bits; only mixed
            # blocks go coefficient by coefficient. The per-coefficient merge alone ran ~5 ns per
            # coefficient with 128-bit code (x86-64-v2), ~2 ns with AVX-512 code.
            while j0 + 16 <= e - a:
                blk = mb[j0:j0 + 16]
                nsb = 0
                for i in range(16):
                    nsb += blk[i] != 0
                if nsb == 0:
                    nv = newv[_u(ki):_u(ki + 16)]
                    ng = nb_[j0:j0 + 16]
                    for i in range(16):
                        blk[i] = nv[i]
                    for i in range(16):   # signs of the ones that became significant, in order
                        bec = 1 if nv[i] > 0 else 0
                        ng[i] = bec * sv[_u(si)]
                        si += bec
                    ki += 16
                elif nsb == 16:
                    lv = lowv[_u(li):_u(li + 16)]
                    for i in range(16):
                        blk[i] = (blk[i] << m) | lv[i]
                    li += 16
                else:
                    # selects on int32 values here: the blend below (int64 multiplies) measured
                    # 2.9x slower in 128-bit code (11.5 vs 3.9 ms per 3.1 M coefficients), as fast
                    # in AVX-512 code
                    for i in range(16):
                        q = np.int32(blk[i])
                        sig = q != 0
                        r = np.int32(lowv[_u(li)])
                        v = np.int32(newv[_u(ki)])
                        sb = sv[_u(si)]
                        bec = (not sig) and v > 0
                        blk[i] = ((q << m) | r) if sig else v
                        nb_[j0 + i] = nb_[j0 + i] if sig else (sb if bec else np.uint8(0))
                        li += np.int64(sig)
                        ki += np.int64(not sig)
                        si += np.int64(bec)
                j0 += 16
        for j in range(j0, e - a):
            q = mb[j]
            sig = 1 if q != 0 else 0
            nw = 1 - sig
            r = lowv[_u(li)]
            v = newv[_u(ki)]
            became = nw * (v > 0)
            sb = sv[_u(si)]
            # arithmetic blends, not selects: LLVM turns selects over loads back into branches
            mb[j] = sig * ((q << m) | r) + nw * v
            nb_[j] = sig * nb_[j] + became * sb
            li += sig
            ki += nw
            si += became
    return 0


@njit(nogil=True, cache=True, inline="always")
def _deadzone(mr, nr, st, off, o):
    """o[c] = sign (mr[c] + off) st, 0 where mr[c] is 0 (float32, as the reference decoder; off is
    the part's reconstruction offset, 1/2 = the bin midpoint)."""
    for c in range(o.size):
        q = mr[c]
        v = (np.float32(q) + off) * st
        v = -v if nr[c] else v
        o[c] = v if q != 0 else np.float32(0.0)


@njit(nogil=True, cache=True)
def reconstruct(mag, neg, perm, C, step, off, out):
    """Dead-zone reconstruction into (T, C) float32 in token-grid order: sign (mag + off) step,
    0 where mag is 0; band-sorted row r lands at row perm[r]. float32 arithmetic as the reference."""
    T = perm.size
    st = np.float32(step)
    of = np.float32(off)
    for r in range(T):
        _deadzone(mag[r * C:(r + 1) * C], neg[r * C:(r + 1) * C], st, of, out[perm[r]])


@njit(nogil=True, cache=True)
def reconstruct_blocks(mag, neg, perm, C, step, off, cb, out):
    """`reconstruct` straight into channel blocks: out (C // cb, T, cb) float32, block b holding
    channels [b cb, (b+1) cb) of every token-grid row, so the inverse DCT reads each block in place
    (no copy) while it is in cache. Same float32 arithmetic as `reconstruct`."""
    T = perm.size
    st = np.float32(step)
    of = np.float32(off)
    nblk = C // cb
    for r in range(T):
        row = perm[r]
        for b in range(nblk):
            a = r * C + b * cb
            _deadzone(mag[a:a + cb], neg[a:a + cb], st, of, out[b, row])


@njit(nogil=True, cache=True)
def cachegen_dequant(sym, amax, mx, out):
    """CacheGen: (C, T) symbols (channel-major, as coded) -> (C, T) float32 (s - MAX) amax_t / MAX
    (float32 as the reference: (s - MAX) first, then times amax_t / MAX). Channel-major out: a
    transposing write here ran at 8 ns per value; the caller transposes with torch (~1 ns)."""
    C, T = sym.shape
    fmx = np.float32(mx)
    mx32 = np.int32(mx)
    scale = np.empty(T, np.float32)
    for t in range(T):
        scale[t] = np.float32(amax[t]) / fmx
    for c in range(C):
        sc = sym[c]
        o = out[c]
        for t in range(T):
            o[t] = np.float32(np.int32(sc[t] - mx32)) * scale[t]


CG_TILE_T = 256   # tokens x channels per tile of `cachegen_fp16` (the fp16 tile is 32 KiB, in L1)
CG_TILE_C = 64


@njit(nogil=True, cache=True)
def cachegen_fp16(sym, amax, mx, lo, hi, out):
    """CacheGen, channels [lo, hi): (C, T) symbols (channel-major, as coded) -> fp16 bits of
    (s - MAX) amax_t / MAX into out (T, C) uint16: `cachegen_dequant`'s float32 arithmetic and
    the fp16 rounding along each channel's row (contiguous: vectorised) into an L1 tile, then the
    tile transposed into place (the unfused path streamed a float32 (C, T) array, its transpose
    and the fp16 copy through memory)."""
    C, T = sym.shape
    fmx = np.float32(mx)
    scale = np.empty(T, np.float32)
    for t in range(T):
        scale[t] = np.float32(amax[t]) / fmx
    tile = np.empty((CG_TILE_C, CG_TILE_T), np.uint16)
    # s - MAX in int32, as the reference's int32 arrays (numba widens to int64, and int64 -> float
    # has no 128-bit vector conversion: the loop ran one value at a time on x86-64-v2)
    mx32 = np.int32(mx)
    for c0 in range(lo, hi, CG_TILE_C):
        nc = min(CG_TILE_C, hi - c0)
        for t0 in range(0, T, CG_TILE_T):
            nt = min(CG_TILE_T, T - t0)
            st = scale[t0:t0 + nt]
            for cc in range(nc):
                sc = sym[c0 + cc, t0:t0 + nt]
                tr = tile[cc, :nt]
                # value and conversion in one loop (a float32 row, then `to_fp16` over it, ran
                # 1.5-2x slower with x86-64-v2 code, erratically; the same float32 values)
                for tt in range(nt):
                    tr[tt] = _f16_bits(np.float32(np.int32(sc[tt] - mx32)) * st[tt])
            for tt in range(nt):
                o = out[t0 + tt, c0:c0 + nc]
                for cc in range(nc):
                    o[cc] = tile[cc, tt]


@intrinsic
def _f16_bits(typingctx, x):
    """float32 -> its IEEE fp16 bit pattern (uint16) by LLVM's `fptrunc` to half: round to
    nearest even, subnormals, overflow to inf, NaN to a quiet NaN (one F16C `vcvtps2ph` on x86;
    numba has no float16 type on the CPU, so the conversion is emitted directly)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        if _SOFT_F16:
            return _f16_bits_integer(builder, args[0])
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def f16_bits_integer(typingctx, x):
    """`_f16_bits` as the phone-class target computes it (`_f16_bits_integer`), on any target:
    for tests that it equals the hardware conversion."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return _f16_bits_integer(builder, args[0])
    return types.uint16(types.float32), codegen


# The phone-class target compiles for x86-64-v2, which has no fp16 conversion instruction, and
# numba's JIT does not link LLVM's soft-float routine for `fptrunc` to half (the call crashes):
# there the conversion is emitted as integer operations that vectorise at 128 bits. An Arm core
# converts in one instruction (FCVTN), so this makes the proxy slower than a phone, not faster.
_SOFT_F16 = _target.current() == "phone"


def _f16_bits_integer(builder, x):
    """Codegen: float32 x -> its fp16 bit pattern (i16) in integer operations, equal to `fptrunc`
    on every finite value and infinity (round to nearest even, subnormals, overflow to inf); a NaN
    becomes the canonical quiet NaN 0x7e00 with x's sign (torch's software conversion does the
    same). F. Giesen's float_to_half_fast3_rtne, with the subnormal branch as rint(|x| 2^24)
    (exact: a power-of-two scaling, then one rounding to an integer) and the branches as selects."""
    i32, f32 = ir.IntType(32), ir.FloatType()
    c = lambda v: ir.Constant(i32, v)   # noqa: E731
    f = builder.bitcast(x, i32)
    sign = builder.and_(f, c(0x80000000))
    a = builder.xor(f, sign)                                           # |x|'s bits
    odd = builder.and_(builder.lshr(a, c(13)), c(1))
    nrm = builder.lshr(builder.add(builder.add(a, c(((15 - 127) << 23) + 0xFFF & 0xFFFFFFFF)), odd), c(13))
    ax = builder.bitcast(a, f32)
    rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32]), "llvm.rint.f32")
    sub = builder.fptosi(builder.call(rint, [builder.fmul(ax, ir.Constant(f32, 16777216.0))]), i32)
    # The range tests as float compares of |x| (one `cmpps` each; SSE has no unsigned integer
    # compare, and LLVM turned signed compares of the non-negative a back into unsigned ones: 2
    # instructions more per test). Equal to the integer tests a >= 113 << 23, a > 0x7F800000 and
    # a >= 143 << 23 on every x: ordered >= 2^-14 (false for NaN, whose result the last select
    # sets), unordered, unordered >= 2^16 (true for NaN and inf).
    o = builder.select(builder.fcmp_ordered(">=", ax, ir.Constant(f32, 2.0 ** -14)), nrm, sub)   # normal / subnormal
    big = builder.select(builder.fcmp_unordered("uno", ax, ax), c(0x7E00), c(0x7C00))           # NaN / inf
    o = builder.select(builder.fcmp_unordered(">=", ax, ir.Constant(f32, 65536.0)), big, o)
    return builder.trunc(builder.or_(o, builder.lshr(sign, c(16))), ir.IntType(16))


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint that arr[idx] will be read soon (LLVM `llvm.prefetch`, read, keep in all cache levels):
    no effect on results, and an address past the array's end is harmless (a prefetch never
    faults). For strided walks the hardware prefetchers miss, e.g. a channel block of every token
    row, rows 12 KiB apart at Klein sizes."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [i]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])   # read, high locality, data cache
        return context.get_dummy_value()
    return types.void(arr, idx), codegen


@njit(nogil=True, cache=True, inline="always")
def to_fp16(x, out):
    """float32 x (n,) -> IEEE fp16 bit patterns, equal to torch's `.half()` (round to nearest
    even; tested on 50,000 values and the edge cases). The hardware conversion replaced F.
    Giesen's float_to_half_fast3_rtne written as integer blends (~15 operations per value:
    ~3x slower here, and every decoded value goes through it)."""
    for c in range(x.size):
        out[c] = _f16_bits(x[c])


def warm_up() -> None:
    """Compile or load every kernel once (tiny inputs), for both magnitude dtypes
    (`progressive.magnitude_dtype`)."""
    starts = np.array([0, 4, 8], np.int64)
    nz = np.array([1, 0], np.uint8)
    ec = np.zeros(2, np.int64)
    cnt = np.zeros(2, np.int64)
    quad_escape_counts(np.array([QUAD_ESC], np.int32), nz, starts, ec)
    sp, bec = np.zeros(3, np.int64), np.zeros(2, np.int64)
    refinement_counts(np.zeros(2, np.int32), nz, cnt, 1, 4, sp, bec)
    out = np.empty((2, 4), np.float32)
    for mdt in (np.int32, np.int16):
        mag = np.zeros(8, mdt)
        neg = np.zeros(8, np.uint8)
        expand_quads_escapes(np.array([QUAD_ESC], np.int32), nz, starts, 2, np.array([0, 1, 2, 4], np.int32), mag,
                             neg, cnt)
        signed_to_mag(np.array([0, 1, 2, 3], np.int32), nz, starts, 2, mag, neg, cnt)
        insignificant_counts(mag, starts, cnt)
        sigptr = np.array([0, 0, 0], np.int64)
        sig_positions(mag, starts, sigptr, np.zeros(8, np.int32), VECTOR_LANES)
        refine_sparse(0, 2, starts, cnt, np.zeros(2, np.int32), nz, sp, 1, 4, np.zeros(6, np.uint8),
                      np.zeros(2, np.int64), np.zeros(6, np.uint8), np.zeros(2, np.int64), 0, np.zeros(1, np.int32),
                      sigptr, mag, neg, bec, np.zeros(1, np.int32), np.zeros(1, np.int16))
        refine(mag, neg, starts, nz, cnt, np.zeros(4, np.int32), 1, 1, np.zeros(6, np.uint8), np.zeros(6, np.uint8),
               np.empty(9, np.int16), np.empty(9, np.int16), np.empty(9, np.uint8), VECTOR_LANES)
        reconstruct(mag, neg, np.array([1, 0], np.int64), 4, 0.5, 0.5, out)
        reconstruct_blocks(mag, neg, np.array([1, 0], np.int64), 4, 0.5, 0.5, 2, np.empty((2, 2, 2), np.float32))
    cachegen_dequant(np.zeros((2, 4), np.int32), np.ones(4, np.float32), 3, out)
    cachegen_fp16(np.zeros((2, 4), np.int32), np.ones(4, np.float32), 3, 0, 2, np.empty((4, 2), np.uint16))


# ---------------------------------------------------------------------------------------------
# sparse refinements (round 4): at Klein sizes a rung refines one part, often with ~1-2 % of its
# coefficients significant; the dense merge (`refine`) reads and writes all T*C of them.

def _field_counts(m: int, g: int) -> np.ndarray:
    """(2^(m g),) number of nonzero m-bit fields in each g-field symbol (grouped refinements)."""
    s = np.arange(1 << (m * g))
    return sum(((s >> (m * f)) & ((1 << m) - 1)) != 0 for f in range(g)).astype(np.int64)


#: nonzero fields per symbol, by (m, g) of the grouped layouts (`progressive.group_size`: m g <= 4)
FIELD_COUNTS = np.zeros((5, 5, 16), np.int64)
for _m in range(1, 5):
    for _g in range(1, 5):
        if _m * _g <= 4:
            FIELD_COUNTS[_m, _g, :1 << (_m * _g)] = _field_counts(_m, _g)


@njit(nogil=True, cache=True)
def refinement_counts(sym, nz, counts, m, g, sptr, became):
    """One refinement stream of a part (g new m-bit indices per symbol, flagged bands only): per
    band the offset of its symbols (sptr (nb + 1,)) and how many insignificant coefficients become
    significant (became (nb,), a nonzero new index; only the band's counts[b] fields, not the
    padding of its last symbol). Whole symbols by a table of nonzero fields per symbol. Returns
    False if the symbols do not cover the flagged bands."""
    mmask = (1 << m) - 1
    grouped = g > 1 and m * g <= 4
    lut = FIELD_COUNTS[m if grouped else 0, g if grouped else 0]
    ptr = 0
    for b in range(counts.size):
        sptr[b] = ptr
        became[b] = 0
        if not nz[b]:
            continue
        n = counts[b]
        ns = (n + g - 1) // g
        if ptr + ns > sym.size:
            return False
        sb = sym[ptr:ptr + ns]
        c = 0
        full = n // g
        if grouped:
            for t in range(full):
                c += lut[sb[t] & 15]
        elif g == 1:
            for t in range(full):
                c += sb[t] != 0
        else:
            for t in range(full):
                for f in range(g):
                    c += ((sb[t] >> (m * f)) & mmask) != 0
        for f in range(n - full * g):   # the last symbol's fields inside the band
            c += ((sb[full] >> (m * f)) & mmask) != 0
        became[b] = c
        ptr += ns
    sptr[counts.size] = ptr
    return ptr == sym.size


@njit(nogil=True, cache=True)
def refine_sparse(b_lo, b_hi, starts, counts, sym, nz, sptr, m, g, low, lbit0, signs, sbit0, nsign,
                  sigpos, sigptr, mag, neg, became, newpos, newval):
    """Bands [b_lo, b_hi) of one refinement of one part, in place, touching only what changes:
    the significant coefficients (flat positions sigpos[sigptr[b]:sigptr[b + 1]], in order) get
    their m low bits (`low`, little-endian, m per value in flat order; band b's first at bit
    lbit0[b]); the insignificant ones whose new index is nonzero (g indices per symbol of `sym`,
    band b's from sptr[b], flagged bands only; all-zero symbols are skipped whole) get it and a
    sign bit (`signs`, big-endian in bytes; band b's first at bit sbit0[b], carried on from band
    to band: only b_lo's is read). `counts` (nb,): insignificant coefficients per band before this
    rung; became (nb,) out: how many became significant. The k-th insignificant coefficient of a
    band sits at k + (significant ones before it): one cursor over the band's sigpos. Returns 0,
    or 1 if the sign bits run out (`nsign` of them). `low` and `signs` carry >= 3 bytes of zero
    padding. (At Klein sizes a rung refines ~1-30 % significant coefficients of one part: the
    dense merge it replaces read and wrote all T*C.)

    The new significant coefficients are found first (positions and values into newpos / newval
    (>= nsign,) at their sign-bit index: the caller's scratch memory) and written after, each a
    prefetch ahead: at 4,096 tokens a part's 50 MB are out of cache and the writes, ~100 floats
    apart, were one DRAM round trip each."""
    mmask = (1 << m) - 1
    sb = sbit0[b_lo]
    for b in range(b_lo, b_hi):
        a = starts[b]
        S = sigpos[sigptr[b]:sigptr[b + 1]]
        lb = lbit0[b]
        for i in range(S.size):
            # the positions rise by ~100 floats: too far apart for the hardware prefetchers, and
            # at 4,096 tokens the part (50 MB) is out of cache, so each update was a DRAM round trip
            prefetch(mag, S[min(i + 16, S.size - 1)])
            bit = lb + i * m
            by = _u(bit >> 3)
            w = np.int64(low[by]) | (np.int64(low[by + _u(1)]) << 8) | (np.int64(low[by + _u(2)]) << 16)
            p = _u(S[i])
            mag[p] = (mag[p] << m) | ((w >> (bit & 7)) & mmask)
        became[b] = 0
        if not nz[b]:
            continue
        n = counts[b]
        ns = (n + g - 1) // g
        syms = sym[sptr[b]:sptr[b] + ns]
        c = 0
        nS = S.size
        nb_new = 0
        t0 = 0
        while t0 < ns:
            t1 = min(t0 + 16, ns)
            anyv = 0                      # ~96 % of symbols are 0: blocks of 16 tested at once
            blk = syms[t0:t1]
            for i in range(blk.size):
                anyv |= blk[i]
            if anyv != 0:
                for t in range(t0, t1):
                    s = syms[t]
                    if s == 0:
                        continue
                    for f in range(g):
                        k = t * g + f
                        v = (s >> (m * f)) & mmask
                        if v == 0 or k >= n:
                            continue
                        while c < nS and S[c] - a <= k + c:
                            c += 1
                        if sb >= nsign:
                            return 1
                        newpos[sb] = a + k + c
                        newval[sb] = v
                        sb += 1
                        nb_new += 1
            t0 = t1
        became[b] = nb_new
    s0 = sbit0[b_lo]
    for i in range(s0, sb):
        prefetch(mag, newpos[min(i + 16, sb - 1)])
        prefetch(neg, newpos[min(i + 16, sb - 1)])
        p = _u(newpos[i])
        mag[p] = newval[i]
        neg[p] = (signs[_u(i >> 3)] >> (7 - (i & 7))) & 1
    return 0


@intrinsic
def _nonzero_positions16(typingctx, mag, j, sigpos, sp):
    """The positions j..j+15 whose mag is nonzero, stored in order at sigpos[sp:] (a compressing
    vector store: `llvm.masked.compressstore`, vpcompressd on AVX-512) -> how many. Writes only
    those elements."""
    if not (isinstance(mag, types.Array) and mag.dtype in (types.int32, types.int16)
            and isinstance(sigpos, types.Array) and sigpos.dtype == types.int32):
        return None
    W = 16
    mbits = 32 if mag.dtype == types.int32 else 16

    def codegen(context, builder, signature, args):
        amag, jj, apos, ss = args
        tys = signature.args
        i1, i32 = ir.IntType(1), ir.IntType(32)
        v32, vm = ir.VectorType(i32, W), ir.VectorType(i1, W)
        j = context.cast(builder, jj, tys[1], types.intp)
        pm = builder.gep(context.make_array(tys[0])(context, builder, amag).data, [j])
        vq = ir.VectorType(ir.IntType(mbits), W)
        q = builder.load(builder.bitcast(pm, vq.as_pointer()), align=mbits // 8)
        nz = builder.icmp_unsigned("!=", q, ir.Constant(vq, None))
        pos = builder.add(_splat(builder, v32, builder.trunc(j, i32)), ir.Constant(v32, list(range(W))))
        sp = context.cast(builder, ss, tys[3], types.intp)
        pp = builder.gep(context.make_array(tys[2])(context, builder, apos).data, [sp])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [v32, pp.type, vm]),
                                            "llvm.masked.compressstore.v16i32")
        builder.call(fn, [pos, pp, nz])
        return _popcount(builder, nz)
    return types.int64(mag, j, sigpos, sp), codegen


@intrinsic
def _nonzero_mask64(typingctx, mag, j):
    """Bit i set where mag[j + i] != 0, i < 64 (one vector compare and its lane mask: generic
    LLVM IR, 8 compares and a byte mask per 64 int16 lanes in 128-bit code)."""
    if not (isinstance(mag, types.Array) and mag.dtype in (types.int32, types.int16)):
        return None
    mbits = 32 if mag.dtype == types.int32 else 16

    def codegen(context, builder, signature, args):
        amag, jj = args
        j = context.cast(builder, jj, signature.args[1], types.intp)
        pm = builder.gep(context.make_array(signature.args[0])(context, builder, amag).data, [j])
        vq = ir.VectorType(ir.IntType(mbits), 64)
        q = builder.load(builder.bitcast(pm, vq.as_pointer()), align=mbits // 8)
        return builder.bitcast(builder.icmp_unsigned("!=", q, ir.Constant(vq, None)), ir.IntType(64))
    return types.uint64(mag, j), codegen


@intrinsic
def _ctz64(typingctx, x):
    """The trailing zero bits of a nonzero uint64 (`llvm.cttz`: one tzcnt / bsf)."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])
    return types.uint64(x), codegen


@njit(nogil=True, cache=True)
def sig_positions(mag, starts, sigptr, sigpos, lanes=0):
    """The flat positions of the nonzero magnitudes, in order, band by band, into
    sigpos[sigptr[b]:sigptr[b + 1]] (sigptr from the counts). Runs of 32 are tested at once
    (vectorised; ~1-5 % of them are nonzero where this runs). False if a band's count disagrees.
    `lanes` = 16 (`VECTOR_LANES`): 16 at a time with a compressing store, the same positions;
    8: 64 at a time, their lane mask by one vector compare, then its set bits by `tzcnt` (the
    scalar loop branched on every value of a nonzero run of 32; a table-driven 128-bit compress of
    every nonzero run took 3.7 ms on a Klein part at 4,096 tokens with x86-64-v2 code, this 1.5).
    Positions are int32 (flat indices < 2^31)."""
    for b in range(starts.size - 1):
        sp = sigptr[b]
        end = sigptr[b + 1]
        a = starts[b]
        e = starts[b + 1]
        if lanes == 8:    # 64 at a time: their nonzero mask, then its set bits (~1 per 64 where this runs)
            while a + 64 <= e:
                msk = _nonzero_mask64(mag, a)
                while msk != 0:
                    if sp >= end:
                        return False
                    sigpos[sp] = a + np.int64(_ctz64(msk))
                    sp += 1
                    msk &= msk - np.uint64(1)
                a += 64
        if lanes == 16:   # 16 at a time, the nonzero ones' positions compressed into sigpos
            while a + 16 <= e:
                c = _nonzero_positions16(mag, a, sigpos, sp) if sp + 16 <= sigpos.size else -1
                if c < 0 or sp + c > end:
                    break     # (near the end of sigpos, or a count disagrees: the scalar scan decides)
                sp += c
                a += 16
        for j0 in range(a, e, 32):
            j1 = min(j0 + 32, e)
            blk = mag[j0:j1]
            anyv = 0
            for i in range(blk.size):
                anyv |= blk[i]
            if anyv == 0:
                continue
            for i in range(blk.size):
                if blk[i] != 0:
                    if sp >= end:
                        return False
                    sigpos[sp] = j0 + i
                    sp += 1
        if sp != end:
            return False
    return True
