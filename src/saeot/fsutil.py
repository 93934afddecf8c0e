"""Atomic folder writes for saeot: the repository's one durable-write helper (``sakura.fsutil``).

``with atomic_folder(dst) as tmp: write files into tmp``: on success ``tmp`` replaces ``dst``;
on error nothing under ``dst`` changes. Kept importable from here so saeot's call sites stay put.
"""

from sakura.fsutil import atomic_folder, atomic_write

__all__ = ["atomic_folder", "atomic_write"]
