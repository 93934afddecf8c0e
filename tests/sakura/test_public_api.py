"""The public Python API: `import sakura` is light and names every job; the docs example builds,
serves and edits through it; a plugin package (its own entry point) adds a model the CLI then
builds and edits with; a wheel installed away from the source tree edits."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sakura

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


def _env(**extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    return env


def test_import_sakura_loads_no_heavy_dependency():
    code = "import sys, sakura; print(sorted(m for m in ('torch', 'diffusers', 'aiohttp', 'numba') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_public_name_resolves_and_is_documented():
    for name in sakura.__all__:
        obj = getattr(sakura, name)
        if name != "__version__":
            assert (obj.__doc__ or "").strip(), f"sakura.{name} has no docstring"
    with pytest.raises(AttributeError):
        sakura.no_such_thing  # noqa: B018


def test_registry_names_the_bundled_models_and_refuses_unknown_ones():
    assert {"sakura-mini", "flux2-mini", "klein"} <= set(sakura.available_models())
    with pytest.raises(ValueError, match="unknown model 'nope'.*sakura-mini"):
        sakura.load_model("nope")
    with pytest.raises(ValueError, match="klein needs a local folder"):
        sakura.load_model("klein")


def test_register_model_adds_a_name_and_refuses_a_duplicate():
    from sakura.models import MiniConfig, MiniDiT, unregister_model

    made = []

    @sakura.register_model("test-tiny-mini")
    def load(arg, **options):
        made.append(arg)
        return MiniDiT(MiniConfig(dim=32, depth=2, heads=2)).eval()

    try:
        m = sakura.load_model("test-tiny-mini:abc")
        assert made == ["abc"] and m.num_layers == 2
        with pytest.raises(ValueError, match="already registered"):
            sakura.register_model("test-tiny-mini", load)
        with pytest.raises(ValueError, match="already registered"):
            sakura.register_model("sakura-mini", load)  # an entry point's name
    finally:
        unregister_model("test-tiny-mini")


def test_editor_rejects_bad_input_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="server must be http"):
        sakura.Editor("ftp://x")
    with pytest.raises(ValueError, match="policy must be one of"):
        sakura.Editor("http://127.0.0.1:9", policy="cachegen")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sakura.open_store(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match="not a sakura store"):
        sakura.open_store(tmp_path / "plain")


def test_example_script_builds_serves_and_edits(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "docs/examples/build_serve_edit.py"), str(tmp_path)],
                       capture_output=True, text=True, env=_env(), timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("my-look:", "my-sticker:"))]
    assert len(lines) == 2 and all("layers fetched" in ln for ln in lines), r.stdout
    from PIL import Image

    for t in ("my-look", "my-sticker"):
        assert Image.open(tmp_path / f"edited-{t}.png").size == (64, 64)
        assert (tmp_path / f"edited-{t}.compare.png").is_file()
    store = sakura.open_store(tmp_path / "store")
    assert {tid for _, tid in store.manifest_keys()} == {"my-look", "my-sticker"}
    assert store.verify().ok


PLUGIN = textwrap.dedent('''
    """acme's adapter for sakura: a small sakura-mini-architecture DiT, seeded by the spec's argument."""
    import torch
    from sakura.models import MiniConfig, MiniDiT


    def load(arg: str, **options):
        torch.manual_seed(int(arg or 0))
        return MiniDiT(MiniConfig(dim=32, depth=3, heads=2)).eval()
''')


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """A real plugin package, pip-installed (no deps) into its own folder with its entry point."""
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "acme-sakura"
    (pkg / "acme_sakura").mkdir(parents=True)
    (pkg / "acme_sakura" / "__init__.py").write_text(PLUGIN)
    (pkg / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "acme-sakura"
        version = "0.0.1"
        [project.entry-points."sakura.models"]
        acme-mini = "acme_sakura:load"
    '''))
    site = root / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(site), str(pkg)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(site.glob("acme_sakura-*.dist-info/entry_points.txt"))
    return site


def _sakura(args, site, **kw):
    env = _env(PYTHONPATH=os.pathsep.join([str(site), str(SRC)]))
    return subprocess.run([sys.executable, "-c", "from sakura.cli import app; app()", *args], capture_output=True,
                          text=True, env=env, timeout=900, **kw)


def test_a_plugin_package_adds_a_model_that_build_and_edit_use(plugin_site, tmp_path):
    store, photo = tmp_path / "store", tmp_path / "photo.png"
    from PIL import Image

    Image.new("RGB", (80, 60), (30, 120, 200)).save(photo)
    r = _sakura(["build", str(store), "--model", "acme-mini:7", "--template", "look-00", "--calibration", "1"],
                plugin_site)
    assert r.returncode == 0, r.stderr[-2000:]
    from sakura.wire.server import serve_in_thread

    with serve_in_thread(store) as url:
        r = _sakura(["edit", str(photo), "--server", url, "--model", "acme-mini:7", "--template", "look-00",
                     "--out", str(tmp_path / "e.png"), "--gallery", str(tmp_path / "g"), "--json", "--steps", "2",
                     "--prior-mbps", "1000"], plugin_site)
        assert r.returncode == 0, r.stderr[-2000:]
        rec = json.loads(r.stdout)
        assert rec["template"] == "look-00" and rec["layers_total"] == 3 and len(rec["layers"]) == 3
        assert all(layer["how"] in ("fetched", "computed here") for layer in rec["layers"])
        # another seed is another model: its fingerprint has no template on this server
        r = _sakura(["edit", str(photo), "--server", url, "--model", "acme-mini:8", "--template", "look-00",
                     "--out", str(tmp_path / "e2.png"), "--gallery", str(tmp_path / "g")], plugin_site)
        assert r.returncode == 2 and "offers no template 'look-00'" in r.stderr
    r = _sakura(["build", str(store), "--model", "acme-mini:x", "--template", "look-00"], plugin_site)
    assert r.returncode != 0


def _install_wheel_in_a_fresh_venv(tmp_path) -> tuple[Path, Path]:
    """`pip wheel .`, installed (no deps) into a fresh venv that borrows this venv's dependencies
    -> (the venv's python, its site-packages)."""
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = wheels.glob("sakura_kv-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")  # dependencies only: a .pth in them is not read
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                        str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return venv / "bin" / "python", site


def _run_elsewhere(python: Path, site: Path, tmp_path, script: str, *args: str) -> subprocess.CompletedProcess:
    work = tmp_path / "elsewhere"
    work.mkdir(exist_ok=True)
    env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", textwrap.dedent(script), str(site), *args], capture_output=True, text=True,
                          cwd=work, env=env, timeout=900)


def test_a_wheel_installed_away_from_the_source_tree_carries_its_data_and_edits_locally(tmp_path):
    """The wheel, run from a folder outside the repository: sakura, its bundled weights and its
    native decoder come from the wheel; it serves a store (built here by the source tree) and
    edits against it (the toy model computes its layers faster than it fetches them: the edit
    runs on the device, so no JIT either: an edit warms no numba kernel where the native decoder
    loads). (A build from the wheel is the slow test below:
    a fresh install compiles the builder's numba kernels cold, a minute of CPU.)"""
    r = _sakura(["build", str(tmp_path / "store"), "--template", "sticker-00", "--calibration", "1"], SRC)
    assert r.returncode == 0, r.stderr[-2000:]
    python, site = _install_wheel_in_a_fresh_venv(tmp_path)
    r = _run_elsewhere(python, site, tmp_path, '''
        import sys, sakura
        from pathlib import Path
        from PIL import Image
        from sakura.codec import native
        here = Path(sys.argv[1])
        assert Path(sakura.__file__).is_relative_to(here), sakura.__file__
        assert native.available() and native.library_file().is_relative_to(here), native.library_file()
        Image.new("RGB", (64, 64), (200, 120, 30)).save("p.png")
        with sakura.serve(sys.argv[2]) as url:
            r = sakura.edit("p.png", server=url, template="sticker-00", gallery="g", prior_mbps=1000)
        r.save("e.png")
        print("ok", len(r.layers()))
    ''', str(tmp_path / "store"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok 6") and (tmp_path / "elsewhere" / "e.png").is_file()


@pytest.mark.slow
def test_a_wheel_installed_away_from_the_source_tree_builds_serves_and_edits(tmp_path):
    """As above, and a build + serve + edit works from the wheel (numba compiles cold: slow)."""
    python, site = _install_wheel_in_a_fresh_venv(tmp_path)
    r = _run_elsewhere(python, site, tmp_path, '''
        import sys, sakura
        from pathlib import Path
        from PIL import Image
        assert Path(sakura.__file__).is_relative_to(Path(sys.argv[1])), sakura.__file__
        report = sakura.build("store", ["sticker-00"], calibration=1)
        assert report.ok
        Image.new("RGB", (64, 64), (200, 120, 30)).save("p.png")
        with sakura.serve("store") as url:
            r = sakura.edit("p.png", server=url, template="sticker-00", gallery="g", prior_mbps=1000)
        r.save("e.png")
        print("ok", len(r.layers()))
    ''')
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok 6") and (tmp_path / "elsewhere" / "e.png").is_file()


def test_build_takes_device_and_dtype_and_refuses_bad_ones(tmp_path):
    """`sakura.build(device=, dtype=)`: a device or dtype name it does not know is one typed line
    before any work; the CPU in float32 builds (the store holds fp16 KV either way)."""
    import sakura
    from sakura.util.device import DeviceError

    with pytest.raises(DeviceError, match="tpu"):
        sakura.build(tmp_path / "bad", ["look-00"], device="tpu")
    with pytest.raises(DeviceError, match="fp8"):
        sakura.build(tmp_path / "bad", ["look-00"], dtype="fp8")
    rep = sakura.build(tmp_path / "s", ["look-00"], calibration=1, steps=1, device="cpu", dtype="fp32",
                       probe_workers=2)
    assert rep.by_status("built") == ["look-00"]
