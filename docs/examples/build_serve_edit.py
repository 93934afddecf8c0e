"""Build two templates from your own images, serve them on 127.0.0.1 and edit a photo, through
sakura's public Python API. Run: python docs/examples/build_serve_edit.py [WORKDIR]"""

import sys
from pathlib import Path

from PIL import Image, ImageDraw
from skimage import data

import sakura

work = Path(sys.argv[1] if len(sys.argv) > 1 else "out/example")
work.mkdir(parents=True, exist_ok=True)
# Your template images: a colour look (a photo) and a sticker (a drawing on white).
Image.fromarray(data.coffee()).save(work / "look.png")
sticker = Image.new("RGB", (256, 256), "white")
ImageDraw.Draw(sticker).ellipse((40, 40, 216, 216), fill=(220, 30, 60), outline="black", width=8)
sticker.save(work / "sticker.png")
Image.fromarray(data.astronaut()).save(work / "photo.jpg")  # the user's photo: never sent anywhere

templates = [sakura.Template("my-look", [work / "look.png"], task="look"),
             sakura.Template("my-sticker", [work / "sticker.png"], task="sticker")]
report = sakura.build(work / "store", templates, model="sakura-mini", calibration=1)
assert report.ok, report.by_status("failed")

with sakura.serve(work / "store") as url:  # a real HTTP server on a free port
    editor = sakura.Editor(url, model="sakura-mini", gallery=work / "gallery", prior_mbps=1000)
    for template in ("my-look", "my-sticker"):
        result = editor.edit(work / "photo.jpg", template, steps=8)
        result.save(work / f"edited-{template}.png")
        fetched = sum(layer["how"] == "fetched" for layer in result.layers())
        print(f"{template}: {result.latency_s:.2f} s, {fetched}/{len(result.layers())} layers fetched, "
              f"PSNR floor {result.floor_psnr_db:.1f} dB")
print(f"wrote {work}/edited-*.png")
