"""Phone-side client for the cache server: manifests and objects only (never user data)."""

from sakura.wire.client.client import (
    Chunk,
    ClientThread,
    DeadlineExceeded,
    FetchError,
    FetchResult,
    IntegrityError,
    NotFound,
    RedirectRefused,
    RetryPolicy,
    TemplateClient,
    WrongManifest,
)

__all__ = ["Chunk", "ClientThread", "DeadlineExceeded", "FetchError", "FetchResult", "IntegrityError", "NotFound", "RedirectRefused",
           "RetryPolicy", "TemplateClient", "WrongManifest"]
