"""The probe-based allocation (`allocation="probes"`): image distortion measured by edits.

Each (layer, K/V) part's candidate quantisation is measured by an edit of the calibration photos with
that part replaced (`ShardDistortionProbe`), memoised on the decoded bytes and run in threads: the
build as it was before the sensitivity model (issue 41), hundreds of edits per template, kept to
compare against (`sakura build --allocation probes`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any
from concurrent.futures import Future
import os
import threading
import torch
from sakura.models.kv import LayerKV

@dataclass(frozen=True)
class Probing:
    """How image probes run: `batch` edits per model call, `workers` threads at once, the rate
    allocation's on the first `photos` calibration photos (None: all)."""

    batch: int = 1
    workers: int = 1
    photos: int | None = None

    @property
    def at_once(self) -> int:
        """Probes (decoded layers) handed over together: a few per thread, so that the threads
        are not idle while the caller decodes the next ones (one per model call when alone)."""
        return self.batch * (self.workers * 4 if self.workers > 1 else 1)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's, a taskset's)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def many_probe(probe, kv, probing: "Probing"):
    """The probe every shard's `_part_probe` shares (``distortion.many``, which the progressive
    codec's image allocation calls with all of a round's probes): [(layer, "k"/"v", decoded part)]
    -> image MSEs, memoised on (layer, part, decoded bytes).

    With one edit per model call (the CPU default) it also has ``many.submit(layer, part, make)
    -> Future``: `make()` decodes the part in one of `probing.workers` threads, which then probes
    it (`ShardDistortionProbe.image_mse`) unless the memo has it. The codec hands a round's
    probes over at once and the threads take them one by one, decoding included: handed over in
    batches of 8 decoded on the caller's thread, the memo's hits left the threads a few probes a
    call and the decoding ran alone (1.5x on two cores). Else `batch` edits per model call,
    ``many.batch`` parts at a time."""
    memo: dict[tuple[int, str, bytes], Future] = {}
    lock = threading.Lock()

    def replacement(layer: int, part: str, decoded):
        lossless = kv.layers[layer]
        return LayerKV(decoded, lossless.value) if part == "k" else LayerKV(lossless.key, decoded)

    def measure(layer: int, part: str, make) -> float:
        decoded = make()
        key = (layer, part, _digest(decoded))
        with lock:
            known = memo.get(key)
            if known is None:
                memo[key] = mine = Future()
        if known is not None:  # measured, or being measured by a task that is running (no deadlock)
            return known.result()
        try:
            mine.set_result(probe.image_mse(layer, replacement(layer, part, decoded)))
        except BaseException as e:
            mine.set_exception(e)
        return mine.result()

    def submit(layer: int, part: str, make) -> Future:
        if probing.workers > 1:
            return probe.pool(probing.workers).submit(measure, layer, part, make)
        return _done(measure, layer, part, make)

    def many(items) -> list[float]:
        if probing.batch <= 1:
            return [f.result() for f in [submit(layer, part, lambda d=decoded: d) for layer, part, decoded in items]]
        keys = [(layer, part, _digest(decoded)) for layer, part, decoded in items]
        todo: dict[tuple[int, str, bytes], Any] = {}
        for key, (layer, part, decoded) in zip(keys, items):
            if key not in memo and key not in todo:
                todo[key] = (layer, replacement(layer, part, decoded))
        for key, mse in zip(todo, probe.image_mse_many(list(todo.values()), batch=probing.batch,
                                                       workers=probing.workers)):
            memo[key] = _done(lambda m=mse: m)
        return [memo[k].result() for k in keys]

    many.batch = probing.at_once  # what the codec hands over per call (`progressive._probe_many`)
    if probing.batch <= 1:
        many.submit = submit
    return many


def _done(fn, *args):
    """`fn(*args)` run here, as a finished Future (its exception kept for .result())."""
    fut: Future = Future()
    try:
        fut.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001  (raised again where the caller asks for the result)
        fut.set_exception(e)
    return fut


def _digest(t) -> bytes:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).digest()


def part_probe(layer: int, many):
    """`ShardKV.distortion` for layer `layer`: the calibration edits' image MSE with this layer's keys
    or values replaced (the progressive codec's image allocation, `allocate="image"`), through
    `many` (`many_probe`, shared by all shards: memoised on the decoded bytes, since the ladder fit
    and every rendition's tables ask for the same grid points). ``distortion.many`` lets the codec
    batch a round's probes across shards."""

    def distortion(kv: str, decoded) -> float:
        return many([(layer, kv, decoded)])[0]

    distortion.many = many
    return distortion


