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


def _page_block(lang: str, must_contain: str) -> str:
    text = (EXAMPLE.parents[1] / "your-own-model.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split(f"```{lang}\n")[1:]]
    (block,) = [b for b in blocks if must_contain in b]
    return block


@pytest.mark.integration
def test_a_plugin_package_built_from_the_page_installs_and_runs_in_bfloat16(tmp_path):
    """docs/your-own-model.md as a user follows it: the package layout and pyproject.toml the page
    gives, with docs/examples/own_model_plugin.py as its module, pip-installed into a venv of its
    own; then `sakura build`, `serve` and `edit` with its model name, --device cpu --dtype bfloat16,
    found through the entry point alone (nothing registered in-process)."""
    import os
    import socket
    import subprocess
    import time
    import urllib.request

    from PIL import Image

    pkg = tmp_path / "my-sakura-plugin"
    (pkg / "my_sakura_plugin").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(_page_block("toml", 'name = "my-sakura-plugin"'))
    (pkg / "my_sakura_plugin" / "__init__.py").write_text(EXAMPLE.read_text())
    venv, site = tmp_path / "venv", None
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")  # this venv's dependencies (sakura-kv[flux] among them)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "--target", str(site), str(pkg)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(site.glob("my_sakura_plugin-*.dist-info")), "the plugin's metadata (its entry point) is installed"

    # sakura itself from this checkout's src/: an editable install's own .pth is not read from a
    # folder that deps.pth adds, so the checkout is named for every command the venv runs
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    folder = tmp_path / "transformer"
    subprocess.run([str(venv / "bin" / "python"), "-c", "import sys, my_sakura_plugin as p; "
                    "p.write_tiny_transformer(sys.argv[1])", str(folder)], check=True, timeout=300, env=env)
    Image.fromarray((torch.arange(S * S * 3).reshape(S, S, 3) * 7 % 256).to(torch.uint8).numpy()).save(tmp_path / "t.png")
    Image.new("RGB", (40, 30), (30, 140, 200)).save(tmp_path / "photo.png")
    sakura = [str(venv / "bin" / "python"), "-m", "sakura"]
    spec = f"pixel-flux:{folder}@{S}"
    on_cpu_bf16 = ["--device", "cpu", "--dtype", "bfloat16"]
    r = subprocess.run([*sakura, "build", str(tmp_path / "store"), "--model", spec, "--template", f"stripes={tmp_path / 't.png'}",
                        "--prompt", "warm", "--calibration", "1", "--steps", "2", "--quiet", *on_cpu_bf16],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*sakura, "serve", str(tmp_path / "store"), "--port", str(port), "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):  # bounded: 30 s
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except OSError as e:
                if getattr(e, "code", None):
                    break
                time.sleep(0.1)
        r = subprocess.run([*sakura, "edit", str(tmp_path / "photo.png"), "--server", f"http://127.0.0.1:{port}",
                            "--template", "stripes", "--model", spec, "--steps", "2", "--out", str(tmp_path / "e.png"),
                            "--gallery", str(tmp_path / "g"), "--prior-mbps", "1000", "--json", *on_cpu_bf16],
                           capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    import json

    rec = json.loads(r.stdout)
    assert rec["layers_total"] == 2 and (tmp_path / "e.png").stat().st_size > 100
