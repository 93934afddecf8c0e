"""Templates from a provider's own files: the TOML library format, `--template ID=IMAGE`, and the
up-front validation (one line per problem, exit non-zero, nothing written)."""

import json

import pytest
import torch
from typer.testing import CliRunner

from sakura.cli.main import app
from sakura.cloud.builder.pipeline import build_store
from sakura.wire.store.template_ref import decode_template_ref, split_template_images
from sakura.wire.store.store import Store
from sakura.cloud.builder.template_files import (TemplateSpec, TemplateSpecError, load_library_file, load_template_image,
                                         template_args, validate_specs)
from sakura.cloud.tasks import TASK_NAMES


def _sticker(path, size=48):
    from PIL import Image, ImageDraw

    im = Image.new("RGBA", (size, size + 10), (0, 0, 0, 0))  # not square, transparent: cropped, keyed
    ImageDraw.Draw(im).ellipse((8, 13, size - 8, size - 3), fill=(255, 200, 0, 255), outline=(0, 0, 0, 255), width=3)
    im.save(path)
    return path


def _write(path, text):
    path.write_text(text)
    return path


def test_library_file_is_parsed_relative_to_itself(tmp_path):
    (tmp_path / "refs").mkdir()
    lib = _write(tmp_path / "t.toml", '[[template]]\nid = "a"\nimages = ["refs/x.png", "refs/y.png"]\nprompt = "p"\n'
                                      '[[template]]\nid = "b"\nimages = "refs/x.png"\ntask = "look"\n')
    a, b = load_library_file(lib)
    assert a == TemplateSpec("a", (tmp_path / "refs/x.png", tmp_path / "refs/y.png"), prompt="p")
    assert b == TemplateSpec("b", (tmp_path / "refs/x.png",), task="look")


def test_every_problem_is_reported_once_per_line(tmp_path):
    good = _sticker(tmp_path / "ok.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    specs = [TemplateSpec("x", (good,), task="sticker"), TemplateSpec("x", (tmp_path / "missing.png",), task="stikcer"),
             TemplateSpec("y", (tmp_path / "bad.png",), prompt="make it nice"), TemplateSpec("-z", (good, good), task="look")]
    with pytest.raises(TemplateSpecError) as e:
        validate_specs(specs, conditioning="task", max_images=1, tasks=TASK_NAMES)
    lines = e.value.problems
    assert any("duplicate id 'x'" in p for p in lines)
    assert any("missing.png: no such file" in p for p in lines)
    assert any("unknown task 'stikcer'" in p for p in lines)
    assert any("bad.png: not a readable image" in p for p in lines)
    assert any("a prompt was given, but this model takes none" in p for p in lines)
    assert any("bad id '-z'" in p for p in lines) and any("2 images, but this model takes at most 1" in p for p in lines)
    assert all("\n" not in p for p in lines) and len(lines) == 7
    # a prompt model: a task is the mistake, and a missing prompt
    with pytest.raises(TemplateSpecError) as e:
        validate_specs([TemplateSpec("k", (good,), task="look")], conditioning="prompt", max_images=4, tasks=TASK_NAMES)
    assert len(e.value.problems) == 2
    validate_specs([TemplateSpec("k", (good, good), prompt="p")], conditioning="prompt", max_images=4, tasks=TASK_NAMES)


def test_template_option_forms(tmp_path):
    specs = template_args(["look-00", f"mine={tmp_path}/a.png,{tmp_path}/b.png"], task="look")
    assert specs[0] == "look-00" and specs[1].images == (tmp_path / "a.png", tmp_path / "b.png")
    with pytest.raises(TemplateSpecError):
        template_args(["look-00"], task="look")          # --task without an ID=IMAGE
    with pytest.raises(TemplateSpecError):
        template_args(["m=a.png"], task="look", prompt="p")


def test_bad_library_exits_nonzero_with_one_line_each_and_writes_nothing(tmp_path):
    _sticker(tmp_path / "ok.png")
    lib = _write(tmp_path / "t.toml", '[[template]]\nid = "a"\nimages = ["ok.png"]\ntask = "sticker"\n'
                                      '[[template]]\nid = "a"\nimages = ["nope.png"]\nprompt = "hi"\n')
    store = tmp_path / "store"
    r = CliRunner().invoke(app, ["build", str(store), "--library", str(lib)])
    assert r.exit_code == 2
    err = [l for l in r.output.splitlines() if l.startswith("error: ")]
    assert len(err) == 3 and any("duplicate id 'a'" in l for l in err) and any("nope.png" in l for l in err)
    assert not store.exists()
    r = CliRunner().invoke(app, ["build", str(store), "--library", str(tmp_path / "absent.toml")])
    assert r.exit_code == 2 and "no such library file" in r.output and not store.exists()
    _write(tmp_path / "broken.toml", "[[template]\nid=")
    r = CliRunner().invoke(app, ["build", str(store), "--library", str(tmp_path / "broken.toml")])
    assert r.exit_code == 2 and "not valid TOML" in r.output and not store.exists()


def test_own_sticker_builds_from_a_library_file(tmp_path):
    png = _sticker(tmp_path / "sun.png")
    lib = _write(tmp_path / "t.toml", '[[template]]\nid = "my-sun"\nimages = ["sun.png"]\ntask = "sticker"\n')
    store = tmp_path / "store"
    build_store(store, templates=load_library_file(lib), ladder=["lossless"], calibration=1, steps=1, log=lambda s: None)
    st = Store(store)
    (fp, tid), = st.manifest_keys()
    m = st.get_manifest(fp, tid)
    assert tid == "my-sun" and m.kv_layout["instruction"] == 3 and m.kv_layout["model"] == "sakura-mini"
    img = split_template_images(decode_template_ref(st.get_object(m.template_ref.object)))
    want = load_template_image(png, img.shape[-1], background=(0.0, 1.0, 0.0))
    assert torch.equal(img[0], want)                         # the PNG holds exactly the captured pixels
    assert torch.equal(img[0, :, 0, 0], torch.tensor([0.0, 1.0, 0.0]))  # transparency became the green key
    assert len(m.kv_layout["images_sha256"]) == 1 and json.dumps(m.kv_layout)
