"""The `sakura` command line: a thin shell over the Python API, one module per command group."""

from sakura.cli.main import app

__all__ = ["app"]
