"""saeot: semantic optimal-transport distances between sparse-autoencoder features."""

__version__ = "0.1.0"
