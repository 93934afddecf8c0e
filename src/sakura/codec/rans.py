"""Interleaved rANS with static tables: the decoder the phone runs (numba, releases the GIL).

One *stream* codes a sequence of symbols in *segments*: runs of symbols that share one context
(a row of the stream's frequency table: a DCT band, a (layer, channel) of CacheGen). The decoder
knows the segments (they follow from the layout and what it decoded before), so only symbols are
coded. The stream is cut into *pieces* of `piece` symbols, each with its own rANS states and its
own words, so pieces decode independently (several threads share one large shard); inside a
piece `lanes` interleaved states (ryg_rans' interleaving) give the CPU independent dependency
chains.

Coder (ryg_rans' word-based variant): state x in [2^16, 2^32), 16-bit renormalisation (at most one
word per symbol), frequencies quantised to `bits` (12-16) bits per context row with every symbol's
frequency >= 1, slot -> symbol lookup table built per segment in the decoder (one table of
2^bits entries, L1-resident; a stream's tables are never all expanded, so a model's memory is its
(rows, A) frequency table). Words are little-endian u16: per piece the lanes' final states (two
words each, high first), then the renormalisation words in decode order. A piece is valid only if
it ends with every state back at 2^16 and its words exactly used up (the decoder checks both: a
wrong table or a corrupt stream raises `CorruptError`, it never reads out of bounds).

Two decoders of the same bitstream: `decode` (numba, `nogil=True`, `cache=True`) and
`decode_reference` (plain Python, the same arithmetic written as straightforwardly as possible;
for exactness tests and the bench's reference column).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Executor
from typing import Any, Callable
from dataclasses import dataclass
from pathlib import Path
import time

import numpy as np

from .bitstream import CodecError, CorruptError
from . import kernels

RANS_L = 1 << 16          # lower bound of the state; words are 16 bits
PIECE = 1 << 16           # symbols per independent piece (a Klein rung-0 part: ~12 pieces)
BIG_LANES = 8             # interleaved states for streams of >= BIG_STREAM symbols
BIG_STREAM = 1024
MAX_ALPHABET = 1 << 15


def _numba_cache_dir() -> None:
    """numba writes its disk cache next to the module; where that is read-only (an installed
    package), use ~/.cache/sakura/numba instead (NUMBA_CACHE_DIR wins if set)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    here = Path(__file__).parent
    if not os.access(here, os.W_OK):
        d = Path.home() / ".cache" / "sakura" / "numba"
        d.mkdir(parents=True, exist_ok=True)
        os.environ["NUMBA_CACHE_DIR"] = str(d)


_numba_cache_dir()
import numba  # noqa: E402  (after the cache directory is settled)
from numba import njit  # noqa: E402


def prob_bits(alphabet: int) -> int:
    """Frequency precision of a table over `alphabet` symbols: 14 bits up to 2,048 symbols (12 bits
    cost +2.9% bytes on the progressive rung 0, whose all-zero quads have p ~ 0.99; 14 bits +1.0%
    against constriction's exact models), 16 for wider alphabets so every symbol gets >= 1."""
    if not 2 <= alphabet <= MAX_ALPHABET:
        raise CodecError(f"rANS alphabet {alphabet} outside [2, {MAX_ALPHABET}]")
    return 14 if alphabet <= 2048 else 16


def lanes_for(n: int) -> int:
    """Interleaved states of a stream of n symbols (small streams: one state, 4 bytes of flush)."""
    return BIG_LANES if n >= BIG_STREAM else 1


@dataclass(frozen=True)
class Model:
    """Quantised static frequencies: freq (rows, A) int32 summing to 2^bits per row, cum (rows, A+1)."""

    freq: np.ndarray
    cum: np.ndarray
    bits: int

    # Alike in shape only to saeot.distributions.FeatureDistributions (two shape properties of an array).
    @property
    def rows(self) -> int:
        return self.freq.shape[0]

    @property
    def alphabet(self) -> int:
        return self.freq.shape[1]

    @staticmethod
    def from_probs(p: np.ndarray) -> "Model":
        """(rows, A) positive weights -> quantised model. Deterministic (numpy float64, no ties left
        to chance): f = 1 + floor(p (M - A)), the remainder goes to each row's most probable symbol."""
        p = np.asarray(p, np.float64)
        if p.ndim != 2:
            raise CodecError("rANS model needs a (rows, alphabet) table")
        rows, A = p.shape
        bits = prob_bits(A)
        M = 1 << bits
        p = p / p.sum(axis=1, keepdims=True)
        f = 1 + np.floor(p * (M - A)).astype(np.int64)
        f[np.arange(rows), np.argmax(p, axis=1)] += M - f.sum(axis=1)
        cum = np.zeros((rows, A + 1), np.int64)
        np.cumsum(f, axis=1, out=cum[:, 1:])
        return Model(f.astype(np.int32), cum.astype(np.int32), bits)

    @staticmethod
    def from_counts(counts: np.ndarray) -> "Model":
        """Laplace-smoothed counts (counts + 1), as the previous ANS models were."""
        return Model.from_probs(np.asarray(counts, np.float64) + 1.0)


def segments_of(lengths: np.ndarray, ctx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(seg_ctx int32, seg_len int64) from per-context lengths (contexts 0..n-1 unless `ctx`);
    empty segments are dropped (they code nothing)."""
    lengths = np.asarray(lengths, np.int64)
    ctx = np.arange(lengths.size, dtype=np.int32) if ctx is None else np.asarray(ctx, np.int32)
    keep = lengths > 0
    return np.ascontiguousarray(ctx[keep]), np.ascontiguousarray(lengths[keep])


# ---------------------------------------------------------------------------------------------
# encoder (cloud side; numba too, since Klein-sized shards have millions of symbols)

@njit(nogil=True, cache=True)
def _encode_piece(sym, ctx, a, b, freq, cum, bits, lanes, buf):
    """Encode symbols [a, b) (reverse order) into buf backwards; returns the number of words."""
    M_SHIFT = 32 - bits
    st = np.full(lanes, RANS_L, np.int64)
    w = buf.size
    for i in range(b - 1, a - 1, -1):
        lane = (i - a) & (lanes - 1)
        c = ctx[i]
        s = sym[i]
        f = np.int64(freq[c, s])
        x = st[lane]
        if x >= (f << M_SHIFT):
            w -= 1
            buf[w] = x & 0xFFFF
            x >>= 16
        st[lane] = ((x // f) << bits) + (x % f) + cum[c, s]
    for lane in range(lanes - 1, -1, -1):
        w -= 2
        buf[w] = (st[lane] >> 16) & 0xFFFF
        buf[w + 1] = st[lane] & 0xFFFF
    return buf.size - w


def encode(sym: np.ndarray, seg_ctx: np.ndarray, seg_len: np.ndarray, model: Model,
           piece: int = PIECE) -> tuple[np.ndarray, np.ndarray]:
    """Symbols (n,) in segment order -> (words <u2, per-piece word counts <u4). Symbols must be in
    [0, A); contexts in [0, rows)."""
    sym = np.ascontiguousarray(sym, np.int32).reshape(-1)
    n = int(np.sum(seg_len))
    if sym.size != n:
        raise CodecError(f"rANS: {sym.size} symbols for segments of {n}")
    if n == 0:
        return np.zeros(0, "<u2"), np.zeros(0, "<u4")
    if sym.min() < 0 or sym.max() >= model.alphabet:
        raise CodecError(f"rANS: symbol outside the alphabet [0, {model.alphabet})")
    ctx = np.repeat(np.asarray(seg_ctx, np.int32), np.asarray(seg_len, np.int64))
    lanes = lanes_for(n)
    words, counts = [], []
    for a in range(0, n, piece):
        b = min(n, a + piece)
        buf = np.empty(b - a + 2 * lanes, np.uint16)
        k = _encode_piece(sym, ctx, a, b, model.freq, model.cum, model.bits, lanes, buf)
        words.append(buf[buf.size - k:])
        counts.append(k)
    return np.concatenate(words).astype("<u2"), np.array(counts, "<u4")


# ---------------------------------------------------------------------------------------------
# decoder (the phone's)

ERR_WORDS = 1       # a piece needs more words than it has
ERR_STATE = 2       # a piece ends with a state other than 2^16 (wrong table or corrupt stream)
ERR_LEFTOVER = 3    # a piece leaves words unread
ERR_LAYOUT = 4      # piece table does not fit the stream


@njit(nogil=True, cache=True)
def _build_slots(freq, cum, c, bits, tab):
    # slice fills (vectorised); an index loop here cost ~4 ns per decoded symbol on CacheGen's
    # 1,024-symbol per-channel segments (numba's wraparound check stops vectorisation)
    fr = freq[c]
    cm = cum[c]
    for s in range(fr.size):
        tab[cm[s]:cm[s] + fr[s]] = s


@njit(nogil=True, cache=True, inline="always")
def _step(x, tab, f, cm, mask, bits, words, p, pend):
    """One decode step of one lane: (new state, symbol, word position, ok)."""
    slot = x & mask
    s = tab[slot]
    x = np.int64(f[s]) * (x >> bits) + slot - cm[s]
    if x < RANS_L:
        if p >= pend:
            return x, s, p, False
        x = (x << 16) | np.int64(words[p])
        p += 1
    return x, s, p, True


@njit(nogil=True, cache=True, inline="always")
def _fast(x, tab, f, cm, mask, bits, words, p):
    """`_step` without the bounds check (the caller knows a word is there) and without a branch:
    the renormalisation is taken at random, ~1 step in 3, and a mispredicted branch per step made
    the decoder 6x slower (12 vs 2.1 ns per symbol here)."""
    slot = x & mask
    s = tab[slot]
    x = np.int64(f[s]) * (x >> bits) + slot - cm[s]
    need = x < RANS_L
    w = np.int64(words[p])
    x = ((x << 16) | w) if need else x
    p += np.int64(need)
    return x, s, p


@njit(nogil=True, cache=True, inline="always")
def _singles(st, tab, f, cm, mask, bits, words, p, pend, out, a, j, stop, lanes, to_lane0):
    """Single checked steps from symbol j until `stop`, or (to_lane0) until the next lane-0
    symbol: the head and the tail around the unrolled 8-lane body. -> (j, p, ok)."""
    while j < stop and not (to_lane0 and ((j - a) & (lanes - 1)) == 0):
        lane = (j - a) & (lanes - 1)
        x, s, p, ok = _step(st[lane], tab, f, cm, mask, bits, words, p, pend)
        if not ok:
            return j, p, False
        st[lane] = x
        out[j] = s
        j += 1
    return j, p, True


@njit(nogil=True, cache=True)
def _decode_pieces(words, starts, seg_ctx, seg_len, freq, cum, bits, piece, lanes, n, p_lo, p_hi, out, tab):
    """Decode pieces [p_lo, p_hi) of a stream of n symbols into out[(first symbol)...]. Returns an
    error code (0 = fine). `starts` (pieces + 1,) are the pieces' word offsets. `tab` (2^bits,):
    the slot -> symbol table's memory, uint8 for alphabets <= 256, else int16 (symbols < 2^15): a
    14-bit table is 16 / 32 KiB (L1); CacheGen rebuilds it per channel of T symbols, and the
    byte table halves that fill."""
    mask = (1 << bits) - 1
    st = np.empty(lanes, np.int64)
    # the segment holding symbol p_lo * piece
    i = p_lo * piece
    seg = 0
    seg_end = seg_len[0] if seg_len.size else 0
    while seg < seg_len.size - 1 and seg_end <= i:
        seg += 1
        seg_end += seg_len[seg]
    cur = -1
    for pc in range(p_lo, p_hi):
        a = pc * piece
        b = min(n, a + piece)
        p = starts[pc]
        pend = starts[pc + 1]
        if pend - p < 2 * lanes:
            return ERR_WORDS
        for lane in range(lanes):
            st[lane] = (np.int64(words[p]) << 16) | np.int64(words[p + 1])
            p += 2
        i = a
        while i < b:
            while seg_end <= i:
                seg += 1
                seg_end += seg_len[seg]
            c = seg_ctx[seg]
            if c != cur:
                _build_slots(freq, cum, c, bits, tab)
                cur = c
            stop = min(b, seg_end)
            f = freq[c]
            cm = cum[c]
            # head: single steps until lane 0 (so the unrolled body sees lanes 0..7 in order)
            j, p, ok = _singles(st, tab, f, cm, mask, bits, words, p, pend, out, a, i, stop, lanes, True)
            if not ok:
                return ERR_WORDS
            if lanes == 8 and j + 8 <= stop:
                x0, x1, x2, x3, x4, x5, x6, x7 = st[0], st[1], st[2], st[3], st[4], st[5], st[6], st[7]
                # a step reads at most one word: with >= 8 words left a block needs no bounds checks
                while j + 8 <= stop and pend - p >= 8:
                    x0, s0, p = _fast(x0, tab, f, cm, mask, bits, words, p)
                    x1, s1, p = _fast(x1, tab, f, cm, mask, bits, words, p)
                    x2, s2, p = _fast(x2, tab, f, cm, mask, bits, words, p)
                    x3, s3, p = _fast(x3, tab, f, cm, mask, bits, words, p)
                    x4, s4, p = _fast(x4, tab, f, cm, mask, bits, words, p)
                    x5, s5, p = _fast(x5, tab, f, cm, mask, bits, words, p)
                    x6, s6, p = _fast(x6, tab, f, cm, mask, bits, words, p)
                    x7, s7, p = _fast(x7, tab, f, cm, mask, bits, words, p)
                    out[j] = s0
                    out[j + 1] = s1
                    out[j + 2] = s2
                    out[j + 3] = s3
                    out[j + 4] = s4
                    out[j + 5] = s5
                    out[j + 6] = s6
                    out[j + 7] = s7
                    j += 8
                st[0], st[1], st[2], st[3], st[4], st[5], st[6], st[7] = x0, x1, x2, x3, x4, x5, x6, x7
            j, p, ok = _singles(st, tab, f, cm, mask, bits, words, p, pend, out, a, j, stop, lanes, False)
            if not ok:
                return ERR_WORDS
            i = stop
        if p != pend:
            return ERR_LEFTOVER
        for lane in range(lanes):
            if st[lane] != RANS_L:
                return ERR_STATE
    return 0


_ERRORS = {ERR_WORDS: "runs out of words", ERR_STATE: "ends in a wrong state (wrong tables or corrupt data)",
           ERR_LEFTOVER: "has leftover words (wrong tables or corrupt data)", ERR_LAYOUT: "has a bad piece table"}


def _check_stream(words: np.ndarray, counts: np.ndarray, seg_ctx: np.ndarray, seg_len: np.ndarray, model: Model,
                  piece: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
    words = np.ascontiguousarray(words, np.uint16).reshape(-1)
    counts = np.asarray(counts, np.int64).reshape(-1)
    seg_ctx = np.ascontiguousarray(seg_ctx, np.int32)
    seg_len = np.ascontiguousarray(seg_len, np.int64)
    n = int(seg_len.sum())
    pieces = -(-n // piece) if n else 0
    if counts.size != pieces or (counts < 0).any() or int(counts.sum()) != words.size:
        raise CorruptError(f"entropy-coded stream {_ERRORS[ERR_LAYOUT]}: {counts.size} pieces for {n} symbols, "
                           f"{words.size} words")
    if seg_ctx.size and (seg_ctx.min() < 0 or seg_ctx.max() >= model.rows or seg_len.min() < 0):
        raise CorruptError("entropy-coded stream: context outside the table")
    starts = np.zeros(pieces + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    return words, starts, seg_ctx, seg_len, n, counts


def run_split(pool: Executor | None, fn: Callable[[int, int], Any], n: int, per_worker: int = 4) -> list[Any]:
    """Run fn(lo, hi) over [0, n) cut into contiguous ranges (about `per_worker` per worker of
    `pool`; serially, as fn(0, n), without one) -> the results in range order. The calling thread
    and the pool's workers take the next untaken range until none is left (a thread that gets no
    core on a loaded machine holds up at most the one range it is running), and the caller then
    cancels the helpers that never started, so a call made from inside `pool` itself cannot
    deadlock when all its workers are busy. The ranges write disjoint outputs, so the result is
    the serial one bit for bit."""
    workers = getattr(pool, "_max_workers", 1) if pool is not None else 1
    k = max(1, min(int(workers) * per_worker, n))
    if int(workers) <= 1 or k == 1:
        return [fn(0, n)]
    cuts = [n * i // k for i in range(k + 1)]
    results: list[Any] = [None] * k
    taken = iter(range(k))
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                i = next(taken, None)
            if i is None:
                return
            results[i] = fn(cuts[i], cuts[i + 1])

    helpers = [pool.submit(drain) for _ in range(min(int(workers), k) - 1)]
    try:
        drain()
    finally:
        with lock:                       # stop handing out ranges if the caller failed
            for _ in taken:
                pass
        for f in helpers:
            if not f.cancel():
                f.result()               # re-raises a helper's error
    return results


def decode(words: np.ndarray, counts: np.ndarray, seg_ctx: np.ndarray, seg_len: np.ndarray, model: Model,
           piece: int = PIECE, out: np.ndarray | None = None, pieces: tuple[int, int] | None = None,
           pool: Executor | None = None) -> np.ndarray:
    """Inverse of `encode` -> (n,) int32 symbols (into `out` if given). `pieces=(lo, hi)` decodes only
    those pieces (their symbols land at their places in `out`): threads can split one stream.
    `pool`: split the pieces over its threads (`run_split`; the kernel releases the GIL), the
    same symbols as the serial decode. Raises `CorruptError` if the stream does not decode exactly."""
    words, starts, seg_ctx, seg_len, n, counts = _check_stream(words, counts, seg_ctx, seg_len, model, piece)
    if out is None:
        out = np.empty(n, np.int32)
    elif out.shape != (n,) or out.dtype != np.int32:
        raise ValueError("rANS: out must be an (n,) int32 array")
    lo, hi = (0, counts.size) if pieces is None else pieces
    if n == 0 or lo >= hi:
        return out
    lanes = lanes_for(n)
    tdt = np.uint8 if model.alphabet <= 256 else np.int16

    def run(a: int, b: int) -> int:
        return int(_decode_pieces(words, starts, seg_ctx, seg_len, model.freq, model.cum, model.bits, piece,
                                  lanes, n, lo + a, lo + b, out, np.empty(1 << model.bits, tdt)))
    err = next((e for e in run_split(pool, run, hi - lo) if e), 0)
    if err:
        raise CorruptError(f"entropy-coded stream {_ERRORS[int(err)]}")
    return out


def num_pieces(n: int, piece: int = PIECE) -> int:
    return -(-n // piece) if n else 0


def decode_reference(words: np.ndarray, counts: np.ndarray, seg_ctx: np.ndarray, seg_len: np.ndarray, model: Model,
                     piece: int = PIECE) -> np.ndarray:
    """The same decoder in plain Python: per symbol, find the slot's symbol by scanning the
    cumulative frequencies (no lookup table), update the state, renormalise. Slow (~1 M symbols/s)."""
    words, starts, seg_ctx, seg_len, n, counts = _check_stream(words, counts, seg_ctx, seg_len, model, piece)
    ctx = np.repeat(seg_ctx, seg_len).tolist()
    w = words.tolist()
    freq, cum, bits = model.freq.tolist(), model.cum.tolist(), model.bits
    lanes = lanes_for(n)
    out = []
    for pc in range(counts.size):
        a, b = pc * piece, min(n, (pc + 1) * piece)
        p, pend = int(starts[pc]), int(starts[pc + 1])
        if pend - p < 2 * lanes:
            raise CorruptError(f"entropy-coded stream {_ERRORS[ERR_WORDS]}")
        st = [(w[p + 2 * k] << 16) | w[p + 2 * k + 1] for k in range(lanes)]
        p += 2 * lanes
        for i in range(a, b):
            lane = (i - a) % lanes
            x, c = st[lane], ctx[i]
            slot = x % (1 << bits)
            s = 0
            while cum[c][s + 1] <= slot:
                s += 1
            x = freq[c][s] * (x >> bits) + slot - cum[c][s]
            if x < RANS_L:
                if p >= pend:
                    raise CorruptError(f"entropy-coded stream {_ERRORS[ERR_WORDS]}")
                x = (x << 16) | w[p]
                p += 1
            st[lane] = x
            out.append(s)
        if p != pend:
            raise CorruptError(f"entropy-coded stream {_ERRORS[ERR_LEFTOVER]}")
        if any(x != RANS_L for x in st):
            raise CorruptError(f"entropy-coded stream {_ERRORS[ERR_STATE]}")
    return np.array(out, np.int32)


def warm_up() -> float:
    """Compile (or load from the disk cache) the rANS coder's and the shared decode kernels
    (`kernels`); returns seconds spent. `sakura.codec.warm_up` adds the progressive family's."""
    t0 = time.perf_counter()
    m = Model.from_counts(np.array([[5, 1, 1], [1, 1, 5]]))
    sym = np.array([0, 1, 2, 2, 0], np.int32)
    sc, sl = np.array([0, 1], np.int32), np.array([2, 3], np.int64)
    w, c = encode(sym, sc, sl, m)
    decode(w, c, sc, sl, m)
    wide = Model.from_counts(np.ones((1, 300)))   # the int16 slot table's specialisation
    sym = np.array([299, 0, 7], np.int32)
    sc, sl = np.array([0], np.int32), np.array([3], np.int64)
    w, c = encode(sym, sc, sl, wide)
    decode(w, c, sc, sl, wide)

    kernels.warm_up()
    return time.perf_counter() - t0
