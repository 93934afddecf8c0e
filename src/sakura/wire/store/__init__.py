"""Cache store: content-addressed immutable objects + a validated manifest per (model, template).

Public API (what ``sakura build``, the server and the phone runtime use)::

    from sakura.wire.store import StoreWriter, RenditionInput, Store, Manifest, ObjectRef
    from sakura.wire.store import TemplateStore, AsyncTemplateStore   # the one read interface (api.py)
"""

from sakura.wire.store.api import AsyncTemplateStore, StoreIntegrityError, StoreNotFound, TemplateStore

from sakura.wire.store.layout import check_name, check_sha256, manifest_relpath, object_relpath
from sakura.wire.store import manifest as _manifest
from sakura.wire.store.manifest import *  # noqa: F403 (its __all__: the manifest types, listed once there)
from sakura.wire.store.store import (
    NotAStore,
    RenditionInput,
    Store,
    ObjectDamaged,
    ObjectMissing,
    StoreError,
    StoreStats,
    StoreWriter,
    TemplateStats,
    VerifyReport,
    atomic_write,
    put_object,
    sha256_file,
    store_format,
)

__all__ = [
    "TemplateStore", "AsyncTemplateStore", "StoreNotFound", "StoreIntegrityError", "ObjectMissing", "ObjectDamaged",
    *_manifest.__all__,
    "NotAStore", "store_format", "RenditionInput", "Store", "StoreError", "StoreStats", "StoreWriter", "TemplateStats", "VerifyReport",
    "atomic_write", "put_object", "sha256_file", "check_name", "check_sha256", "manifest_relpath", "object_relpath",
]
