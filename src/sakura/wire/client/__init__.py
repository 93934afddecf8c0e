"""Phone-side client for the cache server: manifests and objects only (never user data)."""

from sakura.wire.client.client import (
    Chunk,
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

__all__ = ["Chunk", "DeadlineExceeded", "FetchError", "FetchResult", "IntegrityError", "NotFound", "RedirectRefused",
           "RetryPolicy", "TemplateClient", "WrongManifest"]
