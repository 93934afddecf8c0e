"""Cloud side: capture a template's KV and measure what matters on public calibration photos.

- `template_importance` (attention.py): attention mass each template token receives.
- `layer_sensitivity` (sensitivity.py): image MSE per unit relative MSE of each layer's K and V.
- `ShardDistortionProbe` (distortion.py): image MSE of one shard's decoded rendition, all other
  shards lossless (the manifest's `image_mse` / `image_psnr_db`).
Calibration photos are public images chosen by the operator, never a user's photo.
"""

from .attention import template_importance
from .distortion import ShardDistortionProbe, psnr_db
from .sensitivity import layer_sensitivity

__all__ = ["ShardDistortionProbe", "layer_sensitivity", "psnr_db", "template_importance"]
