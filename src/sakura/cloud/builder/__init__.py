"""The cloud build pipeline behind `sakura build`: capture template KV (sakura.cloud.capture), encode
it with the codec ladder (sakura.codec), measure each rendition's image distortion and write the
store (sakura.wire.store.StoreWriter); locally (`pipeline.build_store`) or over a Ray cluster
(`distributed.build_templates`). Templates come from the bundled library or a provider's files
(`template_files`).

The phone never imports this package: what both sides share (the manifest, the store layout,
the template reference format) lives in sakura.wire.store.
"""

from sakura.cloud.builder.pipeline import BASE_RUNG_PSNR_DB, DEFAULT_LADDER, QUALITY_FLOOR_SPEC, build_store, default_templates

__all__ = ["BASE_RUNG_PSNR_DB", "DEFAULT_LADDER", "QUALITY_FLOOR_SPEC", "build_store", "default_templates"]
