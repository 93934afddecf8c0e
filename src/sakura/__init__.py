"""sakura: private on-device image editing with streamed, compressed template KV.

The public API, one name per job (each lives in its side's package and is imported on first use,
so ``import sakura`` stays fast)::

    import sakura

    model = sakura.load_model("sakura-mini")               # or "klein:/folder@1024", or a plugin's name
    report = sakura.build("store/", [sakura.Template("my-look", ["look.png"], task="look")])
    with sakura.serve("store/") as url:                    # HTTP on 127.0.0.1 (or hand store/ to nginx)
        result = sakura.edit("photo.jpg", server=url, template="my-look")
    result.save("edited.png"); print(result.to_dict()["layers"])

| name | what | lives in |
|---|---|---|
| `load_model`, `register_model`, `available_models` | model specs and plugins | `sakura.models.registry` |
| `build`, `Template`, `BuildReport` | templates into a store (cloud side) | `sakura.cloud.builder.api` |
| `open_store`, `Store`, `serve`, `serve_forever` | read/verify a store, serve it over HTTP | `sakura.wire` |
| `Editor`, `edit`, `EditResult` | edit photos on the phone side | `sakura.phone.editor` |
| `make_policy` | a streaming method by name (sakura, cachegen-L3, raw-stream, ...) | `sakura.phone.policies` |
"""

from __future__ import annotations

from sakura.util.lazy import lazy_names

__version__ = "0.1.0"

_API = {
    "load_model": "sakura.models.registry",
    "register_model": "sakura.models.registry",
    "available_models": "sakura.models.registry",
    "build": "sakura.cloud.builder.api",
    "Template": "sakura.cloud.builder.api",
    "BuildReport": "sakura.cloud.builder.api",
    "open_store": "sakura.wire",
    "Store": "sakura.wire",
    "serve": "sakura.wire",
    "serve_forever": "sakura.wire",
    "Editor": "sakura.phone.editor",
    "EditResult": "sakura.phone.editor",
    "edit": "sakura.phone.editor",
    "make_policy": "sakura.phone.policies",
}

__all__ = ["__version__", *_API]


# lazy: torch, diffusers and aiohttp load when the first API name is used, not on `import sakura`
__getattr__, __dir__ = lazy_names(__name__, _API, globals())
