"""What a `sakura build` builds when it is not told otherwise: the ladder, the lowest rung's image
target, the quality floor's codec, the default templates.

Its own module because every room of the builder reads them (the pipeline, the template build, the
Ray driver, the incremental skip) and none of them owns them: kept in `pipeline`, they tied the
template build and the Ray driver to the pipeline in import cycles. Plain constants: importing this
loads nothing heavy (the skip of an unchanged store needs them before torch).
"""

from __future__ import annotations

from sakura.cloud.builder.ladder import FLOOR_RUNG_LADDER

#: Default ladder: the progressive transform coder (``progressive`` = ECSQ + token-grid DCT coded by
#: successive refinement, top rung 1.0 bit per value, the lowest fitted per template to
#: ``BASE_RUNG_PSNR_DB``; docs/codec.md), its rungs stored as one object per shard (rung l = a byte
#: prefix: one Range per rung, upgrades fetch only the missing bytes), and the floor rungs where the
#: calibrated ladder stays above them. The profile, the dilated bench and the demo build this same
#: ladder. The exact fallback is computing the KV on the phone from the template reference, so the
#: store keeps no lossless copy. Add "lossless" / "uniform:bits=8" with --ladder when raw streaming
#: is wanted; ``--ladder progressive`` alone leaves the floor rungs out.
DEFAULT_LADDER = ("progressive",) + FLOOR_RUNG_LADDER
#: The lowest rung of the default ladder must reach this image PSNR vs the lossless-KV edit on the
#: calibration photos. On the 12 held-out templates (docs/codec.md) >= 36-37 dB vs lossless kept the
#: edit within 0.5 dB of the lossless edit's PSNR against ground truth; 38 leaves a margin.
BASE_RUNG_PSNR_DB = 38.0
#: Calibration photos the rate allocation's image probes edit (`build_store(allocation_photos=)`):
#: None, all of them. 1 costs ~0.7x the CPU but measured -2.2 dB on look-00's top rung on held-out
#: photos (docs/scale.md).
ALLOCATION_PHOTOS: int | None = None
#: The reference codec of every shard's ``quality_floor`` (measured even when not in the ladder).
QUALITY_FLOOR_SPEC = "cachegen:level=3"
#: The ids `default_templates()` gives (the first library template of each task), known without
#: importing the task library (torch): checked equal by the tests.
DEFAULT_TEMPLATE_IDS = ("look-00", "texture-00", "sticker-00")


def default_templates() -> list[str]:
    """The first training template of each task in the library (e.g. ``look-00``)."""
    return list(DEFAULT_TEMPLATE_IDS)  # without importing the task library (torch): tested equal
