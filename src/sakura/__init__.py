"""sakura: private on-device image editing with streamed, compressed template KV."""

__version__ = "0.1.0"
