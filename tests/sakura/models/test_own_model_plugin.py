"""docs/examples/own_model_plugin.py, the worked plugin of docs/your-own-model.md, run as a user
would: its adapter over a stock diffusers `FluxTransformer2DModel` (tiny, random) registered with
`register_model`, checked against the protocol, built into a store, served on 127.0.0.1 and
streamed into an edit that matches the on-device one bit for bit."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from sakura.models import ImageTemplateEditModel, load_model, register_model, unregister_model

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "own_model_plugin.py"
S = 16


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("own_model_plugin", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # as an installed plugin module would be (dataclasses look it up)
    spec.loader.exec_module(mod)
    folder = mod.write_tiny_transformer(tmp_path_factory.mktemp("pixel-flux"))
    register_model("pixel-flux", mod.load)
    try:
        yield mod, f"pixel-flux:{folder}@{S}"
    finally:
        unregister_model("pixel-flux")
        sys.modules.pop(spec.name, None)


def px(n, seed):
    return torch.rand(n, 3, S, S, generator=torch.Generator().manual_seed(seed))


def test_the_example_adapter_keeps_the_protocol(plugin):
    mod, name = plugin
    torch.set_num_threads(1)
    model = load_model(name)
    assert isinstance(model, mod.PixelFlux) and isinstance(model, ImageTemplateEditModel)
    tmpl, photos = px(1, 1), px(2, 2)
    ext = model.edit(photos, template=tmpl, instruction="warm", mode="extract", steps=3)
    kv = model.extract_template_kv(tmpl, "warm")
    assert kv.num_layers == model.num_layers == 2 and kv.num_tokens == model.cfg.tokens_per_image == 64
    assert torch.equal(model.edit(photos, template_kv=kv, steps=3).image, ext.image)
    assert torch.equal(model.edit(photos, template_kv=ext.template_kv, steps=3).image, ext.image)
    assert (model.edit(photos, template=tmpl.flip(-1), instruction="warm", steps=3).image - ext.image).abs().max() > 1e-3
    with pytest.raises(FileNotFoundError, match="pixel-flux needs"):
        load_model("pixel-flux:/nonexistent")


def test_the_example_plugin_builds_serves_and_streams_bit_exact(plugin, tmp_path):
    from PIL import Image

    from sakura.cloud.builder.pipeline import build_store
    from sakura.cloud.builder.template_files import TemplateSpec
    from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
    from sakura.phone.live import DeviceProfile, streamed_edit
    from sakura.wire.server import serve_in_thread
    from sakura.wire.store.store import Store
    from sakura.wire.store.template_ref import decode_template_ref, split_template_images

    mod, name = plugin
    png = tmp_path / "stripes.png"
    Image.fromarray((torch.arange(S * S * 3).reshape(S, S, 3) * 7 % 256).to(torch.uint8).numpy()).save(png)
    build_store(tmp_path / "store", model_name=name, templates=[TemplateSpec("stripes", (png,), prompt="warm")],
                ladder=("lossless",), calibration=1, steps=2, log=lambda s: None)
    model = load_model(name)
    st = Store(tmp_path / "store")
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    assert m.model_fingerprint == model.fingerprint() and m.kv_layout["model"] == "pixel-flux"
    images = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
    photo = px(1, 5)
    with serve_in_thread(tmp_path / "store") as url:
        res = streamed_edit(model, photo, base_url=url, template_id="stripes", template_image=images,
                            instruction=m.kv_layout["instruction"], policy=FixedPolicy("lossless"),
                            profile=DeviceProfile(compute_s=0.002, local_s=0.05),
                            bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.001), steps=2,
                            manifest=m, allow_fast_path=False)
    assert res.path == "streamed" and res.choices() == ["lossless"] * model.num_layers
    want = model.edit(photo, template_kv=model.extract_template_kv(images, "warm").to(torch.float16), steps=2).image
    assert torch.equal(res.image, want)
