"""Cloud side: capture a template's KV and measure what matters on public calibration photos.

- `template_importance` (attention.py): attention mass each template token receives.
- `layer_sensitivity` (sensitivity.py): image MSE per unit relative MSE of each layer's K and V.
- `token_sensitivity` (sensitivity.py): image MSE per unit squared error of each token's K / V
  (gradient, Hutchinson estimate): what `importance` means for the codec.
- `calibration_photos` (calibration.py): crops of public training photos.
- `measure_kv_sensitivity` (kv_sensitivity.py): a sketch of the calibration edits' Gauss-Newton
  matrix w.r.t. the template KV (a few backward passes): image MSE predicted from any KV error
  (`KVSensitivity`, `PredictedDistortion`), what the build allocates by.
- `ShardDistortionProbe` (distortion.py): image MSE of one shard's decoded rendition, all other
  shards lossless (the manifest's `image_mse` / `image_psnr_db`).
Calibration photos are public images chosen by the operator, never a user's photo.
"""

from .attention import template_importance
from .calibration import CALIBRATION_SOURCES, calibration_photos
from .distortion import ShardDistortionProbe, psnr_db
from .kv_sensitivity import KVSensitivity, PredictedDistortion, measure_kv_sensitivity
from .sensitivity import layer_sensitivity, token_sensitivity

__all__ = ["CALIBRATION_SOURCES", "KVSensitivity", "PredictedDistortion", "ShardDistortionProbe", "calibration_photos", "layer_sensitivity", "psnr_db",
           "measure_kv_sensitivity", "template_importance", "token_sensitivity"]
