"""The Flux family (the [flux] extra: diffusers, transformers): FLUX.2 Klein (`klein`, `klein_image`,
`klein_config`), FLUX.1 Kontext (`kontext`), tiny random pipelines for tests (`klein_tiny`,
`klein_random`, `kontext_tiny`), and what they share instead of copying: the shape fields
(`config.FluxShape`) and the attention pieces (`attention`: joint QKV, masked and probed attention).

Public and stable (docs/api.md), for a Flux-shaped plugin of your own (docs/your-own-model.md):

| name | what |
|---|---|
| `KVSlot` | per-forward state of the block loop: captures the template stream's K/V, or injects a source's |
| `image_ids` | RoPE ids (grid^2, 3) of one image at T coordinate t |
| `kontext_blocks` | `FluxTransformer2DModel.forward` as a generator with the template as its own stream, yielding after each block |
| `kontext_forward` | the same run to the end: the main stream's output |
| `KleinImageModel`, `KontextImageModel` | the two bundled Flux adapters (`klein:/folder@S`, `kontext:/folder@S`) |
| `KleinConfig`, `KontextConfig`, `FluxShape` | their shapes |

Names are imported on first use, so `sakura.models.flux.klein_config` (no torch) stays light.
"""

from __future__ import annotations

from sakura.util.lazy import lazy_names

_LAZY = {
    "KVSlot": ".kontext", "image_ids": ".kontext", "kontext_blocks": ".kontext", "kontext_forward": ".kontext",
    "KontextImageModel": ".kontext", "KontextConfig": ".kontext", "KleinImageModel": ".klein_image",
    "KleinConfig": ".klein_config", "FluxShape": ".config",
}

__all__ = ["FluxShape", "KVSlot", "KleinConfig", "KleinImageModel", "KontextConfig", "KontextImageModel", "image_ids",
           "kontext_blocks", "kontext_forward"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
