"""FLUX.1 Kontext end to end, through the same protocol as Klein and the bundled models: a tiny
random Kontext pipeline written with `save_pretrained` (`kontext_folder` in tests/conftest.py),
`build_store` with a template of an image + prompt, the store served on 127.0.0.1, and a streamed
edit through the live runtime. The lossless rung reproduces the edit with the template KV injected
from the device's own capture bit for bit, and the in-sequence (extract) edit up to the fp16
rounding the store keeps the KV in."""

import pytest
import torch

from sakura.cloud.builder.template_files import TemplateSpec
from sakura.models import load_model
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
from sakura.phone.live import DeviceProfile, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.store.store import Store
from sakura.wire.store.template_ref import decode_template_ref, split_template_images

SIZE = 16          # the tiny pipeline's VAE factor 2 x 2x2 packing -> a 4x4 latent grid
STEPS = 2
PROMPT = "put the sun on the photo"


@pytest.fixture(scope="module")
def kontext_store(kontext_folder, tmp_path_factory):
    from PIL import Image, ImageDraw

    from sakura.cloud.builder.pipeline import build_store

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("kxstore")
    png = root.parent / "sun.png"
    im = Image.new("RGB", (40, 40), (20, 90, 200))
    ImageDraw.Draw(im).ellipse((8, 8, 32, 32), fill=(255, 200, 0))
    im.save(png)
    name = f"kontext:{kontext_folder}@{SIZE}"
    build_store(root, model_name=name, templates=[TemplateSpec("sun", (png,), prompt=PROMPT)],
                ladder=("lossless",), calibration=1, steps=STEPS, log=lambda s: None)
    model = load_model(name)
    st = Store(root)
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    images = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
    with serve_in_thread(root) as url:
        yield model, m, images, url


def test_manifest_records_what_the_kontext_kv_depends_on(kontext_store):
    model, m, images, url = kontext_store
    lay = m.kv_layout
    assert m.model_fingerprint == model.fingerprint() and lay["model"] == "flux1-kontext"
    assert lay["instruction"] == PROMPT and lay["image_size"] == SIZE and lay["layout"]["references"] == 1
    assert lay["rope"]["slots_t"] == [2] and lay["tokens"] == model.cfg.tokens_per_image
    assert lay["template_fingerprint"] == model.template_fingerprint(images, PROMPT)
    assert images.shape == (1, 3, SIZE, SIZE) and len(m.shards) == model.num_layers == 3


def test_streamed_lossless_kontext_edit_is_bit_exact(kontext_store):
    model, m, images, url = kontext_store
    photo = torch.rand(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
    res = streamed_edit(model, photo, base_url=url, template_id="sun", template_image=images,
                        instruction=m.kv_layout["instruction"], policy=FixedPolicy("lossless"),
                        profile=DeviceProfile(compute_s=0.002, local_s=0.05),
                        bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.001), steps=STEPS,
                        manifest=m, allow_fast_path=False)
    assert res.path == "streamed" and res.choices() == ["lossless"] * model.num_layers
    local = model.extract_template_kv(images, PROMPT).to(torch.float16)   # the store keeps fp16
    want = model.edit(photo, template_kv=local, steps=STEPS).image
    assert res.image.shape == (1, 3, SIZE, SIZE) and torch.equal(res.image, want)
    # the in-sequence edit (template tokens computed in the edit's own forward, fp32 K/V) differs
    # from the streamed one by the fp16 rounding of the stored K/V only
    in_seq = model.edit(photo, template=images, instruction=PROMPT, steps=STEPS).image
    assert (in_seq - res.image).abs().max() < 1e-2
    # a streamed edit of an fp32 store would match it bit for bit: the fp32 KV injected equals it
    assert torch.equal(model.edit(photo, template_kv=model.extract_template_kv(images, PROMPT), steps=STEPS).image,
                       in_seq)


def test_the_cli_takes_the_kontext_spec(kontext_store, kontext_folder, tmp_path):
    from PIL import Image
    from typer.testing import CliRunner

    from sakura.cli.main import app

    model, m, images, url = kontext_store
    name = f"kontext:{kontext_folder}@{SIZE}"
    r = CliRunner().invoke(app, ["info", "--model", name])
    assert r.exit_code == 0 and "flux1-kontext" in r.output and model.fingerprint()[:16] in r.output
    photo = tmp_path / "p.png"
    Image.new("RGB", (20, 24), (120, 30, 30)).save(photo)
    r = CliRunner().invoke(app, ["edit", str(photo), "--server", url, "--model", name, "--template", "sun", "--out",
                                 str(tmp_path / "o.png"), "--gallery", str(tmp_path / "g"), "--steps", str(STEPS)])
    assert r.exit_code == 0, r.output
    assert Image.open(tmp_path / "o.png").size == (SIZE, SIZE)
