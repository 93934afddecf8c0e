"""FLUX.2 Klein end to end: a complete tiny Klein pipeline written with `save_pretrained` (built
once per test run, `klein_folder` in tests/conftest.py), `build_store` with a template of a
provider's own image + prompt, the store served on 127.0.0.1, and streamed edits through the live
runtime. The lossless rung must give the on-device edit bit for bit; every other rung stays within
the distortion its manifest records."""

import pytest
import torch

from sakura.cloud.capture import calibration_photos
from sakura.models import load_model
from sakura.phone import BandwidthEstimator, FixedPolicy, RttEstimator
from sakura.phone.discovery import list_templates
from sakura.phone.live import DeviceProfile, Emulation, streamed_edit
from sakura.wire.server import serve_in_thread
from sakura.wire.store.template_ref import decode_template_ref, split_template_images
from sakura.wire.store.store import Store
from sakura.cloud.builder.template_files import TemplateSpec

SIZE = 16          # pixels per side: the tiny pipeline's VAE factor 2 x 2x2 patchify -> a 4x4 latent grid
STEPS = 2
PROMPT = "put the sun on the photo"


def _sun_png(path):
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (40, 40), (20, 90, 200))
    ImageDraw.Draw(im).ellipse((8, 8, 32, 32), fill=(255, 200, 0))
    im.save(path)
    return path


@pytest.fixture(scope="module")
def klein_store(klein_folder, tmp_path_factory):
    from sakura.cloud.builder.pipeline import build_store

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("kstore")
    png = _sun_png(root.parent / "sun.png")
    name = f"klein:{klein_folder}@{SIZE}"
    build_store(root, model_name=name, templates=[TemplateSpec("sun", (png, png.parent / "sun.png"), prompt=PROMPT)],
                ladder=("lossless", "progressive"), calibration=1, steps=STEPS, log=lambda s: None)
    model = load_model(name)
    st = Store(root)
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    images = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
    with serve_in_thread(root) as url:
        yield model, m, images, url


def _streamed(model, m, images, url, rendition, photo):
    return streamed_edit(model, photo, base_url=url, template_id="sun", template_image=images,
                         instruction=m.kv_layout["instruction"], policy=FixedPolicy(rendition),
                         profile=DeviceProfile(compute_s=0.002, local_s=0.05),
                         bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.001), steps=STEPS,
                         manifest=m, allow_fast_path=False)


def test_manifest_records_what_the_klein_kv_depends_on(klein_store):
    model, m, images, url = klein_store
    lay = m.kv_layout
    assert m.model_fingerprint == model.fingerprint() and lay["model"] == "flux2-klein"
    assert lay["instruction"] == PROMPT and lay["layout"]["prompt_sha256"] == lay["layout"]["prompt_sha256"].lower()
    assert lay["image_size"] == SIZE and lay["layout"]["references"] == 2 and len(lay["images_sha256"]) == 2
    assert lay["rope"]["slots_t"] == [10, 20] and lay["tokens"] == 2 * model.cfg.tokens_per_image
    assert lay["template_fingerprint"] == model.template_fingerprint(images, PROMPT)
    assert images.shape == (2, 3, SIZE, SIZE) and len(m.shards) == model.num_layers
    # the distortion probe ran on Klein's KV through the VAE: every rendition has an image distortion
    assert all("image_mse" in r.distortion for s in m.shards for r in s.renditions)
    assert [r.name for r in m.shards[0].renditions][0] == "lossless"
    offered = list_templates(url)
    assert [(t.template_id, t.model, t.rungs) for t in offered] == [("sun", "flux2-klein", len(m.shards[0].renditions))]
    assert offered[0].nbytes == sum(o.bytes for o in m.objects())


def test_streamed_lossless_klein_edit_is_bit_exact_with_the_on_device_edit(klein_store):
    model, m, images, url = klein_store
    photo = torch.rand(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
    res = _streamed(model, m, images, url, "lossless", photo)
    assert res.path == "streamed" and res.choices() == ["lossless"] * model.num_layers
    local = model.extract_template_kv(images, PROMPT).to(torch.float16)
    want = model.edit(photo, template_kv=local, steps=STEPS).image
    assert res.image.shape == (1, 3, SIZE, SIZE) and torch.equal(res.image, want)
    # the template matters: another prompt or other references change the image
    other = model.edit(photo, template=images.flip(-1), instruction=PROMPT, steps=STEPS).image
    assert (other - want).abs().max() > 1e-4


def test_every_klein_rung_is_within_its_recorded_distortion(klein_store):
    model, m, images, url = klein_store
    photo = calibration_photos(SIZE, 1)   # the photo the build measured on, so the bound is the build's own
    local = model.extract_template_kv(images, PROMPT).to(torch.float16)
    ref = model.edit(photo, template_kv=local, steps=STEPS).image.double()
    L = len(m.shards)
    lossy = [r.name for r in m.shards[0].renditions if r.name != "lossless"]
    assert lossy
    for name in lossy:
        res = _streamed(model, m, images, url, name, photo)
        assert res.choices() == [name] * L
        mse = float((res.image.double() - ref).pow(2).mean())
        recorded = sum(s.rendition(name).distortion["image_mse"] for s in m.shards)
        # per-shard errors add to first order: ||sum e_i||^2 <= L sum ||e_i||^2 (plus fp rounding)
        assert mse <= L * recorded * 1.05 + 1e-10, (name, mse, recorded)


def test_templates_command_and_edit_without_a_known_template_list_what_the_server_offers(klein_store, klein_folder,
                                                                                         tmp_path):
    from PIL import Image
    from typer.testing import CliRunner

    from sakura.cli.main import app

    model, m, images, url = klein_store
    r = CliRunner().invoke(app, ["templates", "--server", url])
    assert r.exit_code == 0 and "sun" in r.output and "flux2-klein" in r.output and "/objects/" in r.output
    photo = tmp_path / "p.png"
    Image.new("RGB", (20, 24), (120, 30, 30)).save(photo)
    name = f"klein:{klein_folder}@{SIZE}"
    for extra in ([], ["--template", "nope"]):
        r = CliRunner().invoke(app, ["edit", str(photo), "--server", url, "--model", name, "--out",
                                     str(tmp_path / "o.png"), "--gallery", str(tmp_path / "g"), *extra])
        assert r.exit_code == 2 and "offers 1 for this model" in r.output and "sun " in r.output
        assert not (tmp_path / "o.png").exists()
    r = CliRunner().invoke(app, ["edit", str(photo), "--server", url, "--model", name, "--template", "sun", "--out",
                                 str(tmp_path / "o.png"), "--gallery", str(tmp_path / "g"), "--steps", "2"])
    assert r.exit_code == 0, r.output
    assert Image.open(tmp_path / "o.png").size == (SIZE, SIZE)
    r = CliRunner().invoke(app, ["templates", "--server", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and r.output.startswith("error: ")


def test_klein_runtime_falls_back_to_local_layers_through_template_layers(klein_store):
    """Layers the link does not deliver are computed on the device by the model's lazy
    `template_layers`; with lossless shards for the rest the image is the on-device one up to
    the fp16 rounding of the stored KV."""
    from sakura.phone import MeetInMiddlePolicy
    from sakura.cloud.tasks.quality import psnr_per_image

    model, m, images, url = klein_store
    photo = torch.rand(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(4))
    res = streamed_edit(model, photo, base_url=url, template_id="sun", template_image=images,
                        instruction=m.kv_layout["instruction"], policy=MeetInMiddlePolicy(),
                        profile=DeviceProfile(compute_s=0.05, local_s=0.0005), emulate=Emulation(renditions=("lossless",)),
                        bandwidth=BandwidthEstimator(prior_bps=1e9), rtt=RttEstimator(prior_s=0.001), steps=STEPS,
                        manifest=m, allow_fast_path=False)
    sources = [r.source for r in res.records]
    assert "local" in sources and "lossless" in sources and len(sources) == model.num_layers, sources
    want = model.edit(photo, template=images, instruction=PROMPT, steps=STEPS).image
    assert psnr_per_image(res.image, want).item() > 60
