"""Durable writes for saeot: the repository's one helper, :mod:`sakura.util.fsutil` (temp file in the
same folder + fsync + rename + fsync of the folder), re-exported so saeot's call sites import it
from one place.

- ``atomic_write(path, bytes_or_fn)``: activation shards and manifests, SAE training checkpoints,
  JSON results and the HTML report (a crash never leaves a half-written file under its name).
- ``with atomic_folder(dst) as tmp: write files into tmp``: SAE folders, the tiny model.

saeot depends on sakura here on purpose: ``sakura.util.fsutil`` is standard library only and ships in
the same distribution, so a saeot copy would only be a second helper to keep in step.
"""

from sakura.util.fsutil import atomic_folder, atomic_write

__all__ = ["atomic_folder", "atomic_write"]
