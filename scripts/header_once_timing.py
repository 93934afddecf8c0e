"""What parsing a shard's header once saves on the phone, per shard, side by side in one process.

The phone's decode of one fetched shard (`phone.live.LiveEdit._decode`), before and after issue 42:

    before: limits.check_shard_object parsed the object (header + crc32 over all of it), decode_any
            parsed it again, the codec's _open a third time, and the progressive ladder took one
            more zlib.crc32 pass over each of its objects for the refinement chain (parent_crc)
    after:  one bitstream.parse (header + crc32), its header checked and handed on
            (decode_any(..., parsed=)); the chain's crc32 derived from the verified checksum
            (`Object.whole_crc`, O(log size))

"before" is rebuilt here from the same primitives (three parses and the chain's crc32 passes, then
the decode), so both columns run the same decoder on the same bytes; rounds alternate and the
best of each is kept (a loaded machine slows both alike). Prints a table; asserts nothing.

Usage: PYTHONPATH=src python scripts/header_once_timing.py [--tokens 1024 4096] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
import zlib

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--specs", nargs="+", default=["progressive", "cachegen:level=3", "lossless"])
    args = ap.parse_args()
    torch.set_num_threads(1)

    from sakura.bench.decode_rates import klein_layer
    from sakura.codec import ShardId, codec_from_spec, warm_up
    from sakura.codec import bitstream as bs

    warm_up()
    print("| rendition | tokens | object bytes | header work before (ms) | header work after (ms) "
          "| decode, before (ms) | decode, after (ms) | saved per shard |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for T in args.tokens:
        shard = klein_layer(T)
        ident = ShardId("bench-header", f"klein-{T}", 5)
        for spec in args.specs:
            codec = codec_from_spec(spec)
            tables = codec.fit_tables([shard]) if codec.uses_tables else None
            data = codec.encode(shard, ident, tables)
            ends = codec.level_ends(data) if codec.supports_layers else [len(data)]
            for rung, end in enumerate(ends):
                blob = data[:end]
                spans = list(bs.split_objects(blob))
                chained = codec.supports_layers   # ladders name their parent's crc32

                def header_before():
                    for _ in range(3):    # check_shard_object, decode_any, Codec._open
                        obj = bs.parse(blob, whole=False)
                    if chained:           # zlib.crc32 of every object of the ladder
                        for a, e in spans:
                            zlib.crc32(blob[a:e])
                    return obj

                def header_after():
                    obj = bs.parse(blob, whole=False)
                    if chained:           # each object's whole crc32 derived (a refinement object is
                        for _ in spans:   # parsed by its upgrade, before and after alike: not counted)
                            obj.whole_crc()
                    return obj

                def decode_before():
                    bs.parse(blob, whole=False)   # check_shard_object
                    bs.parse(blob, whole=False)   # decode_any (to find the codec)
                    if chained:
                        for a, e in spans:
                            zlib.crc32(blob[a:e])
                    return codec.decode(blob, ident, tables)   # parses again in _open, as before

                def decode_after():
                    return codec.decode(blob, ident, tables, parsed=bs.parse(blob, whole=False))

                assert torch.equal(decode_before().key, decode_after().key)
                best = {f: float("inf") for f in (header_before, header_after, decode_before, decode_after)}
                for _ in range(args.rounds):
                    for f in best:
                        t = time.thread_time()
                        f()
                        best[f] = min(best[f], time.thread_time() - t)
                hb, ha, db, da = (1e3 * best[f] for f in (header_before, header_after, decode_before, decode_after))
                name = f"{spec}#{rung}" if codec.supports_layers else spec
                print(f"| `{name}` | {T} | {len(blob):,} | {hb:.2f} | {ha:.2f} | {db:.1f} | {da:.1f} | "
                      f"{hb - ha:.2f} ms ({100 * (db - da) / db:.0f} %) |", flush=True)


if __name__ == "__main__":
    main()
