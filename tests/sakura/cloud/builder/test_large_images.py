"""Issue 35 item 8 and the library parts of item 10: large template images are decoded reduced,
library entries one at a time, and library files are checked before they are read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from sakura.cloud.builder.template_files import TemplateSpecError, load_library_file


def _child(code: str, timeout: float = 120.0) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(300)
def test_large_png_is_decoded_reduced(tmp_path):
    """A 6000 x 6000 PNG (a few hundred KB): main converted it to 36 Mpx of float32 RGBA and
    float-resized it (2.0 GB peak, 92 s here); reduced in 8 bits: 0.45 GB (torch's import is
    0.26 GB of it), 2 s."""
    p = tmp_path / "big.png"
    _child(f"""
        from PIL import Image, ImageDraw
        im = Image.new("RGB", (6000, 6000), (200, 30, 30))
        ImageDraw.Draw(im).rectangle((1000, 1000, 5000, 5000), fill=(10, 200, 10))
        im.save({str(p)!r}); print("ok")
    """)
    out = _child(f"""
        import torch
        from sakura.cloud.builder.template_files import load_template_image
        x = load_template_image(__import__("pathlib").Path({str(p)!r}), 64)
        assert x.shape == (3, 64, 64), x.shape
        # VmHWM: this process's own peak since exec (ru_maxrss would count the parent's pages it was forked with)
        hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        print(hwm, float(x[1, 32, 32]), float(x[0, 2, 2]))
    """)
    rss_kib, g_mid, r_corner = out.split()
    assert int(rss_kib) < 1200 * 1024, f"peak RSS {int(rss_kib) / 1024:.0f} MiB"
    assert abs(float(g_mid) - 200 / 255) < 0.02 and abs(float(r_corner) - 200 / 255) < 0.02


def test_reduced_decode_matches_a_plain_resize_of_a_small_image(tmp_path):
    """Below 2x the model's size nothing is reduced: the 8-bit result is what it was."""
    import numpy as np
    from PIL import Image

    from sakura.cloud.builder.template_files import load_template_image

    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((100, 90, 3)) * 255).astype("uint8")).save(tmp_path / "s.png")
    x = load_template_image(tmp_path / "s.png", 64)
    assert x.shape == (3, 64, 64) and float(x.min()) >= 0 and float(x.max()) <= 1
    assert np.allclose(x.numpy() * 255, np.round(x.numpy() * 255))  # 8-bit exact


def test_library_entries_are_decoded_one_at_a_time(tmp_path):
    from PIL import Image

    from sakura.cloud.builder.pipeline import resolve_templates
    from sakura.cloud.builder.template_files import TemplateSpec

    class M:  # what resolve_templates reads of a model
        class cfg:
            image_size = 32
        template_conditioning = "task"
        max_template_images = 4

    Image.new("RGB", (40, 40), (1, 2, 3)).save(tmp_path / "a.png")
    specs = [TemplateSpec(f"t{i}", (tmp_path / "a.png",), task="look") for i in range(5)]
    out = resolve_templates(M(), specs)
    assert [callable(images) for _, images, _ in out] == [True] * 5  # nothing decoded yet
    assert tuple(out[0][1]().shape) == (1, 3, 32, 32)


def _toml(tmp_path, text):
    p = tmp_path / "lib.toml"
    p.write_text(text)
    return p


@pytest.mark.timeout(30)
def test_deeply_nested_toml_is_one_line(tmp_path):
    """1 KB nested 500 deep: main spent 22.8 s and ended in a RecursionError traceback."""
    p = _toml(tmp_path, "x = " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(TemplateSpecError, match="nested"):
        load_library_file(p)


@pytest.mark.timeout(30)
def test_library_fifo_and_device_are_refused(tmp_path):
    fifo = tmp_path / "lib.fifo"
    os.mkfifo(fifo)
    done = threading.Event()
    with pytest.raises(TemplateSpecError, match="not a regular file"):
        load_library_file(fifo)  # main: blocked until a writer came
    done.set()
    with pytest.raises(TemplateSpecError, match="not a regular file"):
        load_library_file("/dev/zero")  # main: grew to a MemoryError


def test_oversized_library_is_refused_before_reading(tmp_path):
    p = tmp_path / "big.toml"
    with open(p, "wb") as f:
        f.truncate(2 << 30)  # sparse
    with pytest.raises(TemplateSpecError, match="limit"):
        load_library_file(p)
