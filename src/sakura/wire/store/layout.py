"""Store layout: the one place that maps names to relative file paths (== URL paths).

The store is plain static files so that any static web server (ours, stock nginx) serves it with
URL paths that map 1:1 onto files under the store root::

    STORE/
      sakura-store.json                           the store's marker: format and version (first build)
      index.json                                  catalogue of manifests (rewritten on commit)
      manifests/<model_fingerprint>/<template_id>.json
      objects/<sha256[:2]>/<sha256>               immutable, content-addressed (name = sha256 of bytes)
      .tmp/                                       temp files for atomic writes (never served)
      .lock                                       writer lock (never served)
      .tmp/.writers.lock                          held (shared) by live writers: stale .tmp/ detection

Every name that enters a path is checked against a strict pattern first: no '/', '\\', '%',
no leading '.', so a path built here can never leave the store root (the server and the client use
the same functions; traversal is impossible by construction, not by filtering).
"""

from __future__ import annotations

import re

#: Names of model fingerprints and template ids: 1..128 chars, starts alphanumeric, then
#: alphanumerics and ``._-``. No '/', no '%', no leading '.', so never '..'.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: Object ids are lowercase hex sha256 digests (64 chars).
SHA256_RE = re.compile(r"[0-9a-f]{64}")

INDEX_PATH = "index.json"
#: The store's own marker, written by the first build: ``{"schema": "sakura.store", "format_version": 1}``.
#: What makes a folder a store (``index.json`` alone does not: any tool may write one).
STORE_MARKER = "sakura-store.json"
MANIFEST_DIR = "manifests"
OBJECT_DIR = "objects"
TMP_DIR = ".tmp"
LOCK_FILE = ".lock"
#: Held shared by every writer while it may have temp files in ``.tmp/``; whoever gets it
#: exclusively knows no writer is alive, so every temp file is stale (left by a killed build).
WRITERS_LOCK = ".tmp/.writers.lock"

#: URL paths the server answers, as anchored regexes over the *raw* (undecoded) request path.
OBJECT_URL_RE = re.compile(r"/objects/([0-9a-f]{2})/([0-9a-f]{64})")
MANIFEST_URL_RE = re.compile(r"/manifests/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/([A-Za-z0-9][A-Za-z0-9._-]{0,127})\.json")
INDEX_URL = "/index.json"


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a valid model fingerprint / template id, else raise ``ValueError``
    naming ``what`` and the rule it breaks."""
    if not isinstance(value, str) or NAME_RE.fullmatch(value) is None:
        raise ValueError(
            f"invalid {what} {shown(value)}: must be 1-128 chars of [A-Za-z0-9._-], starting with a letter or digit"
        )
    return value


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with the full length named:
    a 10 KB template id is not echoed back whole."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(value) if isinstance(value, (str, bytes)) else len(r)} chars)"


def check_sha256(value: object, what: str = "object id") -> str:
    """Return ``value`` if it is a 64-char lowercase hex sha256 digest, else raise ``ValueError``."""
    if not isinstance(value, str) or SHA256_RE.fullmatch(value) is None:
        raise ValueError(f"invalid {what} {shown(value)}: must be 64 lowercase hex chars (a sha256 digest)")
    return value


def object_relpath(sha256: str) -> str:
    """Relative path (== URL path without the leading '/') of the object named ``sha256``."""
    check_sha256(sha256)
    return f"{OBJECT_DIR}/{sha256[:2]}/{sha256}"


def manifest_relpath(model_fingerprint: str, template_id: str) -> str:
    """Relative path (== URL path without the leading '/') of one template's manifest."""
    check_name(model_fingerprint, "model fingerprint")
    check_name(template_id, "template id")
    return f"{MANIFEST_DIR}/{model_fingerprint}/{template_id}.json"
