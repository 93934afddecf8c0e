"""HTTP cache server for a store (aiohttp), an nginx config for serving the same store, and a
caching nginx edge (CDN tier) in front of either."""

from sakura.wire.server.app import make_app, running_server, serve_forever, serve_in_thread, start_server
from sakura.wire.server.nginx import edge_config, nginx_config, run_edge, run_nginx

__all__ = ["make_app", "running_server", "serve_forever", "start_server", "serve_in_thread", "nginx_config", "run_nginx",
           "edge_config", "run_edge"]
