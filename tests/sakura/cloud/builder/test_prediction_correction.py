"""The build scales its predicted image figures by how much the sensitivity model under-predicted the
template's measured edits (never down): a floor that reads better than it is costs the phone quality."""
import math

import pytest

from sakura.cloud.builder.template import PREDICTED_KEY, _correct_predictions
from sakura.util.psnr import psnr_db


def _encoded():
    pred = {"image_mse": 1e-4, "image_psnr_db": psnr_db(1e-4), PREDICTED_KEY: 1.0}
    measured = {"image_mse": 5e-4, "image_psnr_db": psnr_db(5e-4)}  # a figure check: measured, kept as is
    return [[({}, dict(pred), None), ({}, measured, None)]]


def test_optimistic_model_scales_every_predicted_figure_up():
    enc, floors = _encoded(), [{"image_mse": 2e-4, "predicted": True}, {"image_mse": 3e-4}]
    facts = {"figure_checks": [{"predicted_image_mse": 1e-4, "measured_image_mse": 2e-4}],
             "ladder_trials": [{"budget": 1.0, "predicted_psnr_db": 40.0, "measured_psnr_db": 36.0}]}
    k = _correct_predictions(enc, floors, facts)
    assert k == pytest.approx(10 ** 0.4)                         # the larger of 2x and 4 dB (2.51x)
    assert enc[0][0][1]["image_mse"] == pytest.approx(1e-4 * k)
    assert enc[0][0][1]["image_psnr_db"] == pytest.approx(psnr_db(1e-4 * k))
    assert enc[0][1][1]["image_mse"] == 5e-4                      # measured: untouched
    assert floors[0]["image_mse"] == pytest.approx(2e-4 * k, rel=1e-3)
    assert floors[1]["image_mse"] == 3e-4                         # a probed floor: untouched


def test_pessimistic_or_missing_checks_change_nothing():
    enc, floors = _encoded(), [{"image_mse": 2e-4, "predicted": True}]
    facts = {"figure_checks": [{"predicted_image_mse": 4e-4, "measured_image_mse": 1e-4}],
             "ladder_trials": [{"budget": 1.0, "predicted_psnr_db": 35.0, "measured_psnr_db": 36.0},
                               {"budget": 2.0, "predicted_psnr_db": math.inf, "measured_psnr_db": 50.0}]}
    assert _correct_predictions(enc, floors, facts) == 1.0
    assert enc[0][0][1]["image_mse"] == 1e-4 and floors[0]["image_mse"] == 2e-4
    assert _correct_predictions(enc, floors, {}) == 1.0
