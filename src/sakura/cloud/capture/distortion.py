"""Image distortion of one shard's rendition, measured through the edit (the cloud's job).

For the manifest contract (docs/codec.md, "Image distortion in the manifest"): run the edit on the
public calibration photos with only shard i's KV replaced by a decoded rendition and every other
shard at the lossless (fp16) reference, and compare the output image with the all-lossless output.

    image_mse     = mean over calibration photos of the per-pixel MSE, pixels in [0, 1]
    image_psnr_db = 10 log10(1 / image_mse)    (inf when image_mse == 0)

The model is any object with the image-level edit API the bundled models share:
``model.edit(photos, template_kv=TemplateKV, steps=, seed=) -> .image (B, 3, S, S) in [0, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from sakura.models.kv import LayerKV, TemplateKV
from sakura.util.psnr import psnr_db  # noqa: F401  (re-exported by sakura.cloud.capture)




@dataclass
class ShardDistortionProbe:
    """Edits the calibration photos with one layer swapped; caches the all-lossless reference output.

    Args:
        model: the model the KV belongs to (image-level ``edit`` API).
        reference: the template's lossless KV (fp16 as stored); every other shard stays at it.
        photos: (N, 3, S, S) public calibration photos in [0, 1] (never a user's photo).
        steps, seed: sampler settings of the calibration edits.
    """

    model: Any
    reference: TemplateKV
    photos: torch.Tensor
    steps: int = 4
    seed: int = 0
    #: the all-lossless edit of `photos` when the caller has it (else made here: one edit)
    reference_image: torch.Tensor | None = None
    #: resume probes at the replaced layer (`first_step_prefix`: 1/steps of an edit up front, then
    #: ~10 % off each probe); False for a probe that measures one or two layers only
    use_prefix: bool = True

    def __post_init__(self) -> None:
        if self.photos.ndim != 4 or self.photos.shape[0] < 1:
            raise ValueError(f"photos must be (N, 3, H, W) with N >= 1, got {tuple(self.photos.shape)}")
        given = self.reference_image
        self._ref_image = (given if given is not None else self._edit(list(self.reference.layers))).double()
        self.reference_image = self._ref_image  # (N, 3, S, S) float64, as `image_mse` compares against
        # a model that can resume an edit at the replaced layer (sakura-mini: `first_step_prefix`)
        # skips the first step's blocks below it: the same images, ~10 % less compute a probe
        prefix = getattr(self.model, "first_step_prefix", None) if self.use_prefix else None
        self._prefix = prefix(self.photos, self.reference, steps=self.steps, seed=self.seed) if prefix else None

    def _edit(self, layers: list[LayerKV]) -> torch.Tensor:
        kv = TemplateKV(layers, self.reference.model_fingerprint, self.reference.template_fingerprint,
                        self.reference.layout)
        return self.model.edit(self.photos, template_kv=kv, steps=self.steps, seed=self.seed).image


    def edit_replacing(self, layer: int, replacement: LayerKV) -> torch.Tensor:
        """The calibration edit (N, 3, S, S) with `layer` replaced, every other layer lossless."""
        layers = list(self.reference.layers)
        if not 0 <= layer < len(layers):
            raise IndexError(f"layer {layer} out of range ({len(layers)} layers)")
        if self._prefix is not None:
            return self.model.edit_replacing(self._prefix, layer, replacement)
        layers[layer] = replacement
        return self._edit(layers)

    def image_mse(self, layer: int, replacement: LayerKV) -> float:
        """Mean per-pixel MSE (pixels in [0, 1]) of the edit with `layer` replaced, vs the lossless edit."""
        img = self.edit_replacing(layer, replacement).double()
        return float((img - self._ref_image).pow(2).mean(dim=(1, 2, 3)).mean())

    def image_mse_many(self, requests: Sequence[tuple[int, LayerKV]], batch: int = 1,
                       workers: int = 1) -> list[float]:
        """`image_mse` of every (layer, replacement), `batch` edits per model call when the model
        has ``edit_many`` (the bundled sakura-mini: one batched forward per step). batch=1 runs
        every edit on its own, bit for bit what `image_mse` gives; a larger batch changes which
        matmul kernels run (rows per call), so its images may differ in the last bits (~1e-7).

        `workers` > 1: the requests split into that many runs measured in threads at once (torch
        releases the GIL inside its kernels; a CPU build sets one intra-op thread, so each probe
        computes exactly as it would alone: the same values, in order)."""
        n = len(self.reference.layers)
        for layer, _ in requests:
            if not 0 <= layer < n:
                raise IndexError(f"layer {layer} out of range ({n} layers)")
        workers = max(1, min(int(workers), len(requests)))
        if workers > 1 and batch <= 1:  # one probe a task: a thread that finishes takes the next
            return list(self.pool(workers).map(lambda r: self.image_mse(*r), requests))
        if workers > 1:
            per = -(-len(requests) // workers)
            runs = [requests[a:a + per] for a in range(0, len(requests), per)]
            return [m for got in self.pool(workers).map(lambda r: self._mse_run(r, batch), runs) for m in got]
        return self._mse_run(requests, batch)

    def pool(self, workers: int):
        """A thread pool of `workers` threads kept for this probe's life, for `image_mse_many` and
        callers that submit probes themselves (the build: a pool per call cost more than it
        saved); its threads exit with the probe (`close`)."""
        pool = getattr(self, "_threads", None)
        if pool is None or getattr(self, "_thread_count", 0) < workers:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe")
            self._threads, self._thread_count = pool, workers
        return pool

    def close(self) -> None:
        """Stop the probe threads (also done when the probe is garbage-collected)."""
        pool = getattr(self, "_threads", None)
        if pool is not None:
            pool.shutdown(wait=True)
            self._threads = None

    def __del__(self) -> None:
        pool = getattr(self, "_threads", None)
        if pool is not None:
            pool.shutdown(wait=False)

    def _mse_run(self, requests: Sequence[tuple[int, LayerKV]], batch: int) -> list[float]:
        edit_many = getattr(self.model, "edit_many", None)
        out: list[float] = []
        if batch <= 1 or edit_many is None:
            return [self.image_mse(layer, rep) for layer, rep in requests]
        for a in range(0, len(requests), batch):
            chunk = requests[a:a + batch]
            kvs, single = [], []
            for layer, rep in chunk:
                layers = list(self.reference.layers)
                layers[layer] = rep
                kvs.append(TemplateKV(layers, self.reference.model_fingerprint, self.reference.template_fingerprint,
                                      self.reference.layout))
                single.append(rep.keep is not None)
            batched = [kv for kv, s in zip(kvs, single) if not s]
            imgs = iter(edit_many(self.photos, batched, steps=self.steps, seed=self.seed) if batched else [])
            for kv, s in zip(kvs, single):
                img = (self.model.edit(self.photos, template_kv=kv, steps=self.steps, seed=self.seed).image if s
                       else next(imgs)).double()
                out.append(float((img - self._ref_image).pow(2).mean(dim=(1, 2, 3)).mean()))
        return out

    def measure(self, layer: int, replacement: LayerKV) -> dict[str, float]:
        """The manifest's image keys: {"image_mse", "image_psnr_db"}."""
        mse = self.image_mse(layer, replacement)
        return {"image_mse": mse, "image_psnr_db": psnr_db(mse)}
