"""HTTP cache server for a store (aiohttp), and an nginx config for serving the same store."""

from sakura.server.app import make_app, running_server, serve_forever, serve_in_thread, start_server
from sakura.server.nginx import nginx_config, run_nginx

__all__ = ["make_app", "running_server", "serve_forever", "start_server", "serve_in_thread", "nginx_config", "run_nginx"]
