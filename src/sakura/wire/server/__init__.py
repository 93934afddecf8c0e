"""HTTP cache server for a store (aiohttp), an nginx config for serving the same store, and a
caching nginx edge (CDN tier) in front of either."""

from sakura.util.lazy import lazy_names
from sakura.wire.server.nginx import edge_config, nginx_config, run_edge, run_nginx

#: the aiohttp server's names, imported on first use (aiohttp costs 0.12 s): `sakura.wire` imports
#: this package at module top, and writing a store (`sakura build`) never serves
_LAZY = {n: "sakura.wire.server.app" for n in ("make_app", "running_server", "serve_forever", "serve_in_thread",
                                               "start_server")}
__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = ["make_app", "running_server", "serve_forever", "start_server", "serve_in_thread", "nginx_config", "run_nginx",
           "edge_config", "run_edge"]
