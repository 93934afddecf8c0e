"""One read interface for a template store, on local disk (``Store``) or over HTTP (``TemplateClient``).

Both sides use the same method names, argument names and meaning; the local store is synchronous,
the phone's client is ``async`` (the same calls, awaited)::

    keys = store.manifest_keys()                     # [(model_fingerprint, template_id)], sorted
    m = store.get_manifest(model_fp, template_id)    # validated Manifest
    data = store.get_object(m.template_ref.object)   # whole object, size + sha256 checked
    rung = store.get_rendition(shard.rendition("layered:...#0"))         # a rung = a byte prefix (Range)
    up = store.get_rendition(shard.rendition("layered:...#1"), have=rung)  # only the missing bytes move

    keys = await client.manifest_keys(); m = await client.get_manifest(...); ...

Every byte handed out is verified against the manifest (the object's sha256, or the rung prefix's
own sha256), so a caller never sees unverified bytes. There is deliberately no "bytes a..b of an
object" call: an arbitrary range has no checksum in the manifest; ``get_rendition`` is the ranged
read (the prefix ``[len(have), rendition.nbytes)``, verified with ``have`` as one digest).

Errors are the same on both sides: ``StoreNotFound`` (a ``KeyError``) when the manifest or object
does not exist, ``StoreIntegrityError`` when bytes do not match the manifest. The client's
``NotFound`` / ``IntegrityError`` and the local store's errors are subclasses of these.

The client has timed variants on top (``fetch_object`` / ``fetch_rendition`` return a
``FetchResult`` with per-chunk arrival times for the bandwidth estimator); they are HTTP-only and
not part of this interface.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sakura.wire.store.manifest import Manifest, ObjectRef, Rendition

#: The method names both implementations share (tests check the signatures match).
STORE_API_METHODS = ("manifest_keys", "get_manifest", "get_object", "get_rendition")


class StoreNotFound(KeyError):
    """No manifest / object of that name in the store (local: no file; HTTP: 404)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StoreIntegrityError(RuntimeError):
    """Bytes do not match the manifest (size or sha256): damaged on disk, in transit, or a wrong ``have``."""


@runtime_checkable
class TemplateStore(Protocol):
    """Synchronous reader (``sakura.wire.store.Store``)."""

    def manifest_keys(self) -> list[tuple[str, str]]:
        """``(model_fingerprint, template_id)`` of every manifest, sorted."""
        ...

    def get_manifest(self, model_fingerprint: str, template_id: str) -> Manifest:
        """One validated manifest; ``StoreNotFound`` if absent, ``ManifestError`` if malformed."""
        ...

    def get_object(self, ref: ObjectRef) -> bytes:
        """The whole object, size and sha256 checked against ``ref``."""
        ...

    def get_rendition(self, rendition: Rendition, *, have: bytes = b"") -> bytes:
        """The rendition's bytes (a rung: the object's prefix), verified; ``have`` is a lower rung
        of the same object already held, so only the rest is read."""
        ...


@runtime_checkable
class AsyncTemplateStore(Protocol):
    """Asynchronous reader (``sakura.wire.client.TemplateClient``): the same calls, awaited."""

    async def manifest_keys(self) -> list[tuple[str, str]]: ...

    async def get_manifest(self, model_fingerprint: str, template_id: str) -> Manifest: ...

    async def get_object(self, ref: ObjectRef) -> bytes: ...

    async def get_rendition(self, rendition: Rendition, *, have: bytes = b"") -> bytes: ...
