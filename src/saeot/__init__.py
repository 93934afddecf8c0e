"""saeot: semantic optimal-transport distances between sparse-autoencoder features.

The workflows as functions (:mod:`saeot.api`): ``collect_cache`` -> ``train_saes`` ->
``match_layers`` / ``evaluate_pairs``.
"""

from saeot.api import collect_cache, evaluate_pairs, match_layers, train_saes

__version__ = "0.1.0"
__all__ = ["collect_cache", "train_saes", "match_layers", "evaluate_pairs", "__version__"]
