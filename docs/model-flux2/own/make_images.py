"""How the two template images here were made (run in this folder): a drawn sticker with PIL
and a warm colour grade of skimage's `chelsea` photo."""
import numpy as np
from PIL import Image, ImageDraw
from skimage import data, io, transform

im = Image.new("RGBA", (200, 200), (0, 0, 0, 0))
d = ImageDraw.Draw(im)
d.ellipse((40, 40, 160, 160), fill=(255, 200, 0, 255), outline=(0, 0, 0, 255), width=6)
d.ellipse((75, 80, 90, 95), fill=(0, 0, 0, 255))
d.ellipse((110, 80, 125, 95), fill=(0, 0, 0, 255))
d.arc((70, 90, 130, 140), 20, 160, fill=(0, 0, 0, 255), width=5)
im.save("sun.png")

cat = transform.resize(data.chelsea(), (100, 150), anti_aliasing=True).astype(np.float32)
cat = np.clip(cat * np.array([1.25, 0.95, 0.6]) + np.array([0.05, 0.0, 0.0]), 0, 1)
io.imsave("warm-cat.png", (cat * 255).round().astype(np.uint8))
