"""`load_photo`, the one loader `sakura edit` reads photos with: every mode to RGB correctly,
the pixel cap checked from the header, scaling by pixel type (never by the values)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from sakura.phone.photo import PhotoError, load_photo

pytestmark = pytest.mark.timeout(60)


def _save(tmp_path, im: Image.Image, name: str, **kw):
    p = tmp_path / name
    im.save(p, **kw)
    return p


def test_8bit_rgb_is_scaled_by_255_even_when_dark(tmp_path):
    px = np.zeros((32, 32, 3), np.uint8)
    px[::2] = 1  # max value 1: the old loader took it as a [0, 1] float photo (all white/grey)
    out = load_photo(_save(tmp_path, Image.fromarray(px), "dark.png"), 16)
    assert out.shape == (1, 3, 16, 16) and out.dtype.is_floating_point
    assert float(out.max()) <= 1 / 255 + 1e-6


def test_16bit_grayscale_is_scaled_by_65535(tmp_path):
    a = np.full((40, 40), 32768, np.uint16)
    im = Image.fromarray(a)  # mode I;16
    p = _save(tmp_path, im, "g16.png")
    assert Image.open(p).mode.startswith("I")
    out = load_photo(p, 16)
    assert np.allclose(out.numpy(), 32768 / 65535, atol=2e-3)  # mid grey, not all white


def test_cmyk_jpeg_is_converted_not_used_as_rgb(tmp_path):
    im = Image.new("CMYK", (48, 48), (0, 255, 255, 0))  # pure red in CMYK
    out = load_photo(_save(tmp_path, im, "red.jpg", quality=95), 16)
    r, g, b = (float(out[0, c].mean()) for c in range(3))
    assert r > 0.8 and g < 0.2 and b < 0.2


def test_palette_gray_alpha_and_rgba_composite_over_white(tmp_path):
    la = Image.new("LA", (32, 32), (0, 0))  # black, fully transparent
    out = load_photo(_save(tmp_path, la, "la.png"), 16)
    assert out.shape == (1, 3, 16, 16) and float(out.min()) > 0.99
    rgba = Image.new("RGBA", (32, 32), (0, 0, 255, 255))
    out = load_photo(_save(tmp_path, rgba, "rgba.png"), 16)
    assert float(out[0, 2].mean()) > 0.99 and float(out[0, 0].mean()) < 0.01
    pal = Image.new("RGB", (32, 32), (0, 255, 0)).convert("P")
    out = load_photo(_save(tmp_path, pal, "p.png"), 16)
    assert float(out[0, 1].mean()) > 0.95


def test_first_frame_of_an_animation(tmp_path):
    frames = [Image.new("RGB", (32, 32), c) for c in ((255, 0, 0), (0, 0, 255))]
    p = tmp_path / "anim.gif"
    frames[0].save(p, save_all=True, append_images=frames[1:], duration=100, loop=0)
    out = load_photo(p, 16)
    assert out.shape == (1, 3, 16, 16)
    assert float(out[0, 0].mean()) > 0.8 and float(out[0, 2].mean()) < 0.2


def _png_header_only(w: int, h: int) -> bytes:
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


def test_pixel_cap_is_checked_from_the_header_before_decoding(tmp_path):
    p = tmp_path / "huge.png"
    p.write_bytes(_png_header_only(12_000, 12_000))  # 144 Mpx declared, a few bytes on disk
    with pytest.raises(PhotoError, match=r"12000 x 12000 = 144 Mpx is over the 64 Mpx photo limit"):
        load_photo(p, 64)
    p.write_bytes(_png_header_only(20_000, 20_000))  # past Pillow's own bomb limit: still our one line
    with pytest.raises(PhotoError, match="photo limit"):
        load_photo(p, 64)
    small = _save(tmp_path, Image.new("RGB", (200, 100)), "s.png")
    with pytest.raises(PhotoError, match="over the"):
        load_photo(small, 16, max_pixels=10_000)


def test_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(PhotoError, match="no such photo"):
        load_photo(tmp_path / "missing.png", 16)
    with pytest.raises(PhotoError, match="not a file"):
        load_photo(tmp_path, 16)
    (tmp_path / "junk.png").write_bytes(b"hello")
    with pytest.raises(PhotoError, match="not a readable image"):
        load_photo(tmp_path / "junk.png", 16)
    good = (tmp_path / "t.png")
    Image.new("RGB", (64, 64), (9, 9, 9)).save(good)
    (tmp_path / "trunc.png").write_bytes(good.read_bytes()[:60])
    with pytest.raises(PhotoError):
        load_photo(tmp_path / "trunc.png", 16)


def test_large_photo_is_reduced_quickly_and_centre_cropped(tmp_path):
    a = np.zeros((3000, 4000, 3), np.uint8)
    a[:, 500:3500] = 200  # the centre square is uniform grey; the side bands are cropped away
    out = load_photo(_save(tmp_path, Image.fromarray(a), "big.png"), 32)
    assert out.shape == (1, 3, 32, 32) and np.allclose(out.numpy(), 200 / 255, atol=0.01)
