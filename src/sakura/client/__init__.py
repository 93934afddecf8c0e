"""Phone-side client for the cache server: manifests and objects only (never user data)."""

from sakura.client.client import (
    Chunk,
    FetchError,
    FetchResult,
    IntegrityError,
    NotFound,
    TemplateClient,
)

__all__ = ["Chunk", "FetchError", "FetchResult", "IntegrityError", "NotFound", "TemplateClient"]
