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

from sakura.util.lazy import lazy_names

#: public name -> the submodule it lives in, imported on first use (each loads torch): the builder
#: imports this package at module top, and the skip of an unchanged store must load no torch
_LAZY = {"template_importance": ".attention", "CALIBRATION_SOURCES": ".calibration", "calibration_photos": ".calibration",
         "ShardDistortionProbe": ".distortion", "psnr_db": ".distortion", "KVSensitivity": ".kv_sensitivity",
         "PredictedDistortion": ".kv_sensitivity", "measure_kv_sensitivity": ".kv_sensitivity",
         "SKETCH_PROBES": ".kv_sensitivity", "layer_sensitivity": ".sensitivity", "token_sensitivity": ".sensitivity"}
__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = ["CALIBRATION_SOURCES", "KVSensitivity", "PredictedDistortion", "SKETCH_PROBES", "ShardDistortionProbe",
           "calibration_photos", "layer_sensitivity", "psnr_db", "measure_kv_sensitivity", "template_importance",
           "token_sensitivity"]
